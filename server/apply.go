package server

import (
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server/internal/auth"
	"github.com/leased/leased/server/internal/leases"
	"github.com/leased/leased/server/internal/raftnode"
)

// newLeaseState makes the owner of the node's state machine sm, whose entries up to applied are in it.
// The Ready loop hands it the committed entries (leases.State.Apply), and it tells the node's lessor,
// watchers, blocking acquires, metrics, audit trail and proposers what each changed; conf changes go to
// membership (applyConfChange). The hooks read n's fields when called: metrics and the audit trail are
// made after the state.
func newLeaseState(n *node, sm *fsm.FSM, applied uint64) *leases.State {
	lim := n.cfg.Limits
	return leases.New(sm, applied, leases.Config{
		Limits:  leases.Limits{QuotaBytes: lim.QuotaBytes, MaxLeases: lim.MaxLeases, QuotaBytesPerIdentity: lim.QuotaBytesPerIdentity},
		Now:     n.clock.Now,
		Lessor:  n.lessor,
		Watch:   n.watch,
		Queue:   n.queue,
		Metrics: func(res fsm.Result) { n.metrics.leases.Applied(res) },
		Audit: func(index uint64, res fsm.Result) {
			n.audit.Record(index, roleName(n.raft.Role()), res)
		},
		Answer: func(proposalID, index uint64, res fsm.Result) {
			n.proposals.Deliver(proposalID, raftnode.Outcome[fsm.Result]{Index: index, Result: res})
		},
		ConfChange: func(e *raftpb.Entry) error { return n.members.ApplyConfChange(e) },
	})
}

func roleName(st raft.StateType) string {
	switch st {
	case raft.StateLeader:
		return auth.RoleLeader
	case raft.StateCandidate, raft.StatePreCandidate:
		return "candidate"
	default:
		return "follower"
	}
}
