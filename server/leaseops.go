package server

import (
	"context"

	"go.etcd.io/raft/v3"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server/internal/rpc"
)

// MaxBatchWrites is the most writes one Writes request carries (leases.proto). It is part of the API
// rather than a flag, so that a client never has to learn a node's value before it batches.
const MaxBatchWrites = rpc.MaxBatchWrites

// MaxSnapshotStreams is how many Snapshot streams one node serves at a time; more are refused with
// ResourceExhausted. Each stream holds one encoded copy of the state (about the snapshot's size) until it
// ends, so this bounds the memory backups can take (decision 14).
const MaxSnapshotStreams = rpc.MaxSnapshotStreams

// opsNode adapts the node to rpc.LeaseHost, what the request path needs of it: raft through the node,
// the state machine through its owner, the member table through membership.
type opsNode struct{ *node }

var _ rpc.LeaseHost = opsNode{}

func (a opsNode) IsLeader() bool                              { return a.raft.IsLeader() }
func (a opsNode) NotLeaderErr() error                         { return a.raft.NotLeaderErr() }
func (a opsNode) StoppedErr() error                           { return a.raft.StoppedErr() }
func (a opsNode) KnownLeader() uint64                         { return a.raft.KnownLeader() }
func (a opsNode) ConfirmLeadership(ctx context.Context) error { return a.raft.ConfirmLeadership(ctx) }
func (a opsNode) Linearizable(ctx context.Context) error      { return a.raft.Linearizable(ctx) }
func (a opsNode) ReadFSM(fn func(sm *fsm.FSM))                { a.state.Read(fn) }
func (a opsNode) AdmitGrant(resource, identity string) error {
	return a.state.AdmitGrant(resource, identity)
}
func (a opsNode) Held(resource string) bool        { return a.state.Held(resource) }
func (a opsNode) Member(id uint64) *leasepb.Member { return a.members.Member(id) }
func (a opsNode) ClientAddrOf(id uint64) string    { return a.members.ClientAddrOf(id) }

// newLeaseOps wires n's request serving (internal/rpc). The peer transport is looked up per call: it is
// made after the node, and delivers forwarded writes to the LeaseOps built here.
func newLeaseOps(n *node, m *rpc.Metrics) *rpc.LeaseOps {
	return rpc.New(rpc.Config{
		Limits: n.cfg.Limits, ClientCertAuth: n.cfg.ClientCertAuth, PeerTLS: n.cfg.PeerTLS != nil,
		ElectionTimeout: n.cfg.ElectionTimeout(),
	}, rpc.Parts{
		Host: opsNode{n}, Clock: n.clock, ID: n.id, ClusterID: n.clusterID,
		Leader: n.raft.Leader, Term: n.raft.Term, Commit: n.raft.Commit, Applied: n.state.Applied, Proposals: n.proposals,
		LeaderChanged: n.raft.LeaderChanged, Done: n.raft.Done(), Draining: n.draining,
		Queue: n.queue, Lessor: n.lessor, Authz: n.authz, Watch: n.watch, Metrics: m,
		Members: n.members, Status: func() *leasepb.StatusResponse { return statusOf(n) }, Log: n.log, HandoffProposing: &n.hooks.handoffProposing,
		PeerClient: func(id uint64) (wirepb.RaftClient, bool) { return n.transport.PeerClient(id) },
		View:       n.state.View,
	})
}

// statusOf is n's status for the Cluster service's Status (the request path adds its header and the
// live leases).
func statusOf(n *node) *leasepb.StatusResponse {
	self := n.members.Member(n.id)
	return &leasepb.StatusResponse{
		Id:            n.id,
		Name:          n.cfg.Name,
		Role:          roleOf(n.raft.Role(), self.GetIsLearner()),
		Term:          n.raft.Term(),
		LeaderId:      n.raft.KnownLeader(),
		CommitIndex:   n.raft.Commit(),
		AppliedIndex:  n.state.Applied(),
		DbSizeBytes:   n.disk.logBytes.Load(),
		Version:       n.cfg.Version,
		ClientAddr:    n.clientAddr,
		PeerAddr:      n.peerAddr,
		LoopStalledMs: uint64(n.raft.LoopStalled().Milliseconds()),
	}
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
