package server

import (
	"fmt"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/fsm"
)

// applyEntries applies committed entries in order: commands to the FSM, configuration changes to raft and
// the transport. After each command, whoever cares about its result (fsm.Result) hears of it: the lessor,
// watchers, metrics, the blocking-acquire queue and, once the applied index has moved past the entry, the
// proposer waiting for it (so a client never sees a token above the node's applied index).
func (n *node) applyEntries(ents []*raftpb.Entry) error {
	for _, e := range ents {
		if e.GetIndex() <= n.applied.Load() {
			continue // already in the state (replayed after a snapshot restore)
		}
		var (
			cmd *wirepb.Command
			res fsm.Result
			err error
		)
		switch e.GetType() {
		case raftpb.EntryType_EntryNormal:
			cmd, res, err = n.applyNormal(e)
		case raftpb.EntryType_EntryConfChange, raftpb.EntryType_EntryConfChangeV2:
			err = n.members.applyConfChange(e)
		default:
			err = fmt.Errorf("entry %d has unknown type %v", e.GetIndex(), e.GetType())
		}
		if err != nil {
			return err
		}
		n.applied.Store(e.GetIndex())
		n.appliedWait.notify(e.GetIndex())
		if cmd != nil {
			n.answerProposers(e.GetIndex(), cmd, res)
		}
	}
	return nil
}

// applyNormal applies a command entry and tells the listeners; it returns the command and its result
// for the proposers (nil for a new leader's empty entry).
func (n *node) applyNormal(e *raftpb.Entry) (*wirepb.Command, fsm.Result, error) {
	index := e.GetIndex()
	if len(e.GetData()) == 0 { // a new leader's empty entry
		n.fsmMu.Lock()
		err := n.sm.Advance(index)
		n.fsmMu.Unlock()
		n.audit.record(index, raft.StateType(n.role.Load()), fsm.Result{}) // a new leader catches the trail up
		return nil, fsm.Result{}, err
	}
	cmd, err := fsm.DecodeCommand(e.GetData())
	if err != nil {
		return nil, fsm.Result{}, fmt.Errorf("entry %d: %w", index, err)
	}
	n.fsmMu.Lock()
	res, err := n.sm.Apply(index, cmd)
	n.fsmMu.Unlock()
	if err != nil {
		// An unknown command means this binary is older than the cluster: stop rather than diverge.
		return nil, fsm.Result{}, fmt.Errorf("apply entry %d: %w", index, err)
	}
	// The listeners hear of the entry only through its result: the FSM alone decided what changed.
	n.lessor.Applied(n.clock.Now(), res)
	n.size.applied(res)
	n.watch.Publish(index, res.Events)
	n.metrics.applied(res)
	n.audit.record(index, raft.StateType(n.role.Load()), res)
	n.queue.Applied(res)
	return cmd, res, nil
}

// answerProposers hands an applied command's result to the proposer waiting for it, and to the waiting
// acquire a release carried.
func (n *node) answerProposers(index uint64, cmd *wirepb.Command, res fsm.Result) {
	if res.Handoff != nil {
		n.proposals.deliver(cmd.GetReleaseHandoff().GetAcquireProposalId(), proposalOutcome{index: index, result: *res.Handoff})
	}
	n.proposals.deliver(cmd.GetProposalId(), proposalOutcome{index: index, result: res})
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
