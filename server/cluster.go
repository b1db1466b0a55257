package server

import (
	"context"

	"go.etcd.io/raft/v3"

	"github.com/leased/leased/api/leasepb"
)

// clusterService is the gRPC Cluster service. Membership changes arrive in a later issue and answer
// Unimplemented until then; Snapshot is in snapshot.go.
type clusterService struct {
	leasepb.UnimplementedClusterServer
	n         *node
	snapshots snapshotLimiter
}

func (s *clusterService) Status(ctx context.Context, _ *leasepb.StatusRequest) (*leasepb.StatusResponse, error) {
	n := s.n
	self := n.member(n.id)
	return &leasepb.StatusResponse{
		Header:       n.header(),
		Id:           n.id,
		Name:         n.cfg.Name,
		Role:         roleOf(raft.StateType(n.role.Load()), self.GetIsLearner()),
		Term:         n.term.Load(),
		LeaderId:     n.leader.Load(),
		CommitIndex:  n.commit.Load(),
		AppliedIndex: n.applied.Load(),
		DbSizeBytes:  n.storage.Size(),
		Version:      n.cfg.Version,
		ClientAddr:   n.cfg.ClientAddr,
		PeerAddr:     n.cfg.PeerAddr,
		LiveLeases:   uint64(n.liveLeases()),
	}, nil
}

func (n *node) liveLeases() int {
	n.fsmMu.RLock()
	defer n.fsmMu.RUnlock()
	return n.sm.Len()
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

func (s *clusterService) MemberList(context.Context, *leasepb.MemberListRequest) (*leasepb.MemberListResponse, error) {
	return nil, s.n.status(ErrUnimplemented)
}

func (s *clusterService) MemberAdd(context.Context, *leasepb.MemberAddRequest) (*leasepb.MemberAddResponse, error) {
	return nil, s.n.status(ErrUnimplemented)
}

func (s *clusterService) MemberPromote(context.Context, *leasepb.MemberPromoteRequest) (*leasepb.MemberPromoteResponse, error) {
	return nil, s.n.status(ErrUnimplemented)
}

func (s *clusterService) MemberRemove(context.Context, *leasepb.MemberRemoveRequest) (*leasepb.MemberRemoveResponse, error) {
	return nil, s.n.status(ErrUnimplemented)
}

// member returns a copy of a member's record, or nil.
func (n *node) member(id uint64) *leasepb.Member {
	n.membersMu.RLock()
	defer n.membersMu.RUnlock()
	if m, ok := n.members[id]; ok {
		return &leasepb.Member{Id: m.Id, Name: m.Name, PeerAddr: m.PeerAddr, ClientAddr: m.ClientAddr, IsLearner: m.IsLearner}
	}
	return nil
}

func (n *node) clientAddrOf(id uint64) string {
	if id == raft.None {
		return ""
	}
	if id == n.id {
		return n.cfg.ClientAddr
	}
	return n.member(id).GetClientAddr()
}

func (n *node) setClientAddr(id uint64, addr string) {
	n.membersMu.Lock()
	defer n.membersMu.Unlock()
	if m, ok := n.members[id]; ok {
		m.ClientAddr = addr
	}
}
