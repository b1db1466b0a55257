package server

import (
	"context"
	"fmt"
	"log/slog"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/fsm"
)

// applyEntries applies committed entries in order: commands to the FSM, configuration changes to raft and
// the transport. After each command, whoever cares about its result (fsm.Result) hears of it: the lessor,
// watchers, metrics, the blocking-acquire queue and the proposer waiting for it.
func (n *node) applyEntries(ents []*raftpb.Entry) error {
	for _, e := range ents {
		if e.GetIndex() <= n.applied.Load() {
			continue // already in the state (replayed after a snapshot restore)
		}
		var err error
		switch e.GetType() {
		case raftpb.EntryType_EntryNormal:
			err = n.applyNormal(e)
		case raftpb.EntryType_EntryConfChange, raftpb.EntryType_EntryConfChangeV2:
			err = n.applyConfChange(e)
		default:
			err = fmt.Errorf("entry %d has unknown type %v", e.GetIndex(), e.GetType())
		}
		if err != nil {
			return err
		}
		n.applied.Store(e.GetIndex())
		n.appliedWait.notify(e.GetIndex())
	}
	return nil
}

func (n *node) applyNormal(e *raftpb.Entry) error {
	index := e.GetIndex()
	if len(e.GetData()) == 0 { // a new leader's empty entry
		n.fsmMu.Lock()
		err := n.sm.Advance(index)
		n.fsmMu.Unlock()
		return err
	}
	cmd, err := fsm.DecodeCommand(e.GetData())
	if err != nil {
		return fmt.Errorf("entry %d: %w", index, err)
	}
	n.fsmMu.Lock()
	res, err := n.sm.Apply(index, cmd)
	n.fsmMu.Unlock()
	if err != nil {
		// An unknown command means this binary is older than the cluster: stop rather than diverge.
		return fmt.Errorf("apply entry %d: %w", index, err)
	}
	// The listeners hear of the entry only through its result: the FSM alone decided what changed.
	n.lessor.applied(n.clock.Now(), res)
	n.size.applied(res)
	n.watch.publish(index, res.Events)
	n.metrics.applied(res)
	n.audit(index, res)
	n.queue.applied(res)
	if res.Handoff != nil { // the waiting acquire a release carried
		n.proposals.deliver(cmd.GetReleaseHandoff().GetAcquireProposalId(), proposalOutcome{index: index, result: *res.Handoff})
	}
	n.proposals.deliver(cmd.GetProposalId(), proposalOutcome{index: index, result: res})
	return nil
}

// Audit trail messages, one per lease event type. docs/operations.md ("Audit trail") documents the lines.
var auditMessages = map[leasepb.EventType]string{
	leasepb.EventType_EVENT_TYPE_GRANTED:       "lease granted",
	leasepb.EventType_EVENT_TYPE_RELEASED:      "lease released",
	leasepb.EventType_EVENT_TYPE_EXPIRED:       "lease expired",
	leasepb.EventType_EVENT_TYPE_VALUE_CHANGED: "lease value proclaimed",
}

// audit writes the audit trail of one applied entry: an info line per grant, release and expiry, with
// the constant keys event, resource, token, holder, index and role. Every node writes it, as it applies
// the entry, with its raft role at that moment: the role of the node that applies an entry is not a
// property of the entry (across a leadership change the old and the new leader can both, or neither,
// apply it while leading), so "the leader logs" would be either incomplete or duplicated. An entry is
// identified by its index: filter on role="leader" for one copy in steady state, or deduplicate on
// index, resource and token; a node that restarts applies, and so logs, the entries after its snapshot
// again.
func (n *node) audit(index uint64, res fsm.Result) {
	if (len(res.Events) == 0 && !res.Changes.ACLSet) || !n.log.Enabled(context.Background(), slog.LevelInfo) {
		return
	}
	role := roleName(raft.StateType(n.role.Load()))
	if res.Changes.ACLSet {
		n.log.LogAttrs(context.Background(), slog.LevelInfo, "acl rules set",
			slog.String("event", "acl-set"), slog.Uint64("index", index), slog.String("role", role))
	}
	for _, e := range res.Events {
		n.log.LogAttrs(context.Background(), slog.LevelInfo, auditMessages[e.Type],
			slog.String("event", eventTypeLabel[e.Type]),
			slog.String("resource", e.Lease.Resource),
			slog.Uint64("token", e.Lease.Token),
			slog.String("holder", e.Lease.Holder),
			slog.String("identity", e.Lease.Identity),
			slog.Uint64("index", e.Index),
			slog.String("role", role))
		if e.By != "" {
			// An admin released another identity's lease: the second line names both.
			n.log.LogAttrs(context.Background(), slog.LevelInfo, "lease released by admin",
				slog.String("event", "admin-release"),
				slog.String("resource", e.Lease.Resource),
				slog.Uint64("token", e.Lease.Token),
				slog.String("identity", e.Lease.Identity),
				slog.String("admin", e.By),
				slog.Uint64("index", e.Index),
				slog.String("role", role))
		}
	}
}

func roleName(st raft.StateType) string {
	switch st {
	case raft.StateLeader:
		return "leader"
	case raft.StateCandidate, raft.StatePreCandidate:
		return "candidate"
	default:
		return "follower"
	}
}
