package server

import (
	"context"

	"go.etcd.io/raft/v3"

	"github.com/leased/leased/api/leasepb"
)

// clusterService is the gRPC Cluster service: status, membership (internal/membership) and snapshots
// (snapshot.go).
type clusterService struct {
	leasepb.UnimplementedClusterServer
	n         *node
	snapshots snapshotLimiter
}

func (s *clusterService) Status(ctx context.Context, _ *leasepb.StatusRequest) (*leasepb.StatusResponse, error) {
	n := s.n
	self := n.members.Member(n.id)
	return &leasepb.StatusResponse{
		Header:        n.ops.header(),
		Id:            n.id,
		Name:          n.cfg.Name,
		Role:          roleOf(n.raft.Role(), self.GetIsLearner()),
		Term:          n.raft.Term(),
		LeaderId:      n.ops.knownLeader(),
		CommitIndex:   n.raft.Commit(),
		AppliedIndex:  n.state.Applied(),
		DbSizeBytes:   n.disk.logBytes.Load(),
		Version:       n.cfg.Version,
		ClientAddr:    n.clientAddr,
		PeerAddr:      n.peerAddr,
		LiveLeases:    uint64(n.ops.liveLeases()),
		LoopStalledMs: uint64(n.raft.LoopStalled().Milliseconds()),
	}, nil
}

func roleOf(st raft.StateType, learner bool) leasepb.Role {
	switch {
	case learner:
		return leasepb.Role_ROLE_LEARNER
	case st == raft.StateLeader:
		return leasepb.Role_ROLE_LEADER
	case st == raft.StateCandidate:
		return leasepb.Role_ROLE_CANDIDATE
	case st == raft.StatePreCandidate:
		return leasepb.Role_ROLE_PRE_CANDIDATE
	default:
		return leasepb.Role_ROLE_FOLLOWER
	}
}

// MemberList answers the member table: linearizably (after a ReadIndex round) unless serializable.
func (s *clusterService) MemberList(ctx context.Context, req *leasepb.MemberListRequest) (*leasepb.MemberListResponse, error) {
	n := s.n
	if !req.GetSerializable() {
		if err := n.ops.linearizable(ctx); err != nil {
			return nil, n.ops.status(err)
		}
	}
	return &leasepb.MemberListResponse{Header: n.ops.header(), Members: n.members.Table()}, nil
}

// MemberAdd adds a learner; the leader promotes it once it has caught up (internal/membership/promote.go).
func (s *clusterService) MemberAdd(ctx context.Context, req *leasepb.MemberAddRequest) (*leasepb.MemberAddResponse, error) {
	n := s.n
	m, err := n.members.Add(ctx, req.GetName(), req.GetPeerAddr(), req.GetClientAddr())
	if err != nil {
		return nil, n.ops.status(err)
	}
	return &leasepb.MemberAddResponse{Header: n.ops.header(), Member: m, Members: n.members.Table()}, nil
}

func (s *clusterService) MemberPromote(ctx context.Context, req *leasepb.MemberPromoteRequest) (*leasepb.MemberPromoteResponse, error) {
	n := s.n
	if err := n.members.Promote(ctx, req.GetId()); err != nil {
		return nil, n.ops.status(err)
	}
	return &leasepb.MemberPromoteResponse{Header: n.ops.header(), Members: n.members.Table()}, nil
}

func (s *clusterService) MemberRemove(ctx context.Context, req *leasepb.MemberRemoveRequest) (*leasepb.MemberRemoveResponse, error) {
	n := s.n
	if err := n.members.Remove(ctx, req.GetId()); err != nil {
		return nil, n.ops.status(err)
	}
	return &leasepb.MemberRemoveResponse{Header: n.ops.header(), Members: n.members.Table()}, nil
}
