package leases

import (
	"fmt"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/fsm"
)

// Apply applies committed entries in order: commands to the FSM, configuration changes through
// Config.ConfChange. After each command, whoever cares about its result (fsm.Result) hears of it: the
// lessor, watchers, metrics, the blocking-acquire queue and, once the applied index has moved past the
// entry, the proposer waiting for it (so a client never sees a token above the node's applied index).
// The Ready loop calls it; an error stops the loop.
func (s *State) Apply(ents []*raftpb.Entry) error {
	for _, e := range ents {
		if e.GetIndex() <= s.applied.Load() {
			continue // already in the state (replayed after a snapshot restore)
		}
		var (
			cmd *wirepb.Command
			res fsm.Result
			err error
		)
		switch e.GetType() {
		case raftpb.EntryType_EntryNormal:
			cmd, res, err = s.applyNormal(e)
		case raftpb.EntryType_EntryConfChange, raftpb.EntryType_EntryConfChangeV2:
			err = s.cfg.ConfChange(e)
		default:
			err = fmt.Errorf("entry %d has unknown type %v", e.GetIndex(), e.GetType())
		}
		if err != nil {
			return err
		}
		s.applied.Store(e.GetIndex())
		s.appliedWait.Notify(e.GetIndex())
		if cmd != nil {
			s.answerProposers(e.GetIndex(), cmd, res)
		}
	}
	return nil
}

// applyNormal applies a command entry and tells the listeners; it returns the command and its result
// for the proposers (nil for a new leader's empty entry).
func (s *State) applyNormal(e *raftpb.Entry) (*wirepb.Command, fsm.Result, error) {
	index := e.GetIndex()
	if len(e.GetData()) == 0 { // a new leader's empty entry
		s.mu.Lock()
		err := s.sm.Advance(index)
		s.mu.Unlock()
		s.cfg.Audit(index, fsm.Result{}) // a new leader catches the trail up
		return nil, fsm.Result{}, err
	}
	cmd, err := fsm.DecodeCommand(e.GetData())
	if err != nil {
		return nil, fsm.Result{}, fmt.Errorf("entry %d: %w", index, err)
	}
	s.mu.Lock()
	res, err := s.sm.Apply(index, cmd)
	s.mu.Unlock()
	if err != nil {
		// An unknown command means this binary is older than the cluster: stop rather than diverge.
		return nil, fsm.Result{}, fmt.Errorf("apply entry %d: %w", index, err)
	}
	// The listeners hear of the entry only through its result: the FSM alone decided what changed.
	s.cfg.Lessor.Applied(s.cfg.Now(), res)
	s.size.applied(res)
	s.cfg.Watch.Publish(index, res.Events)
	s.cfg.Metrics(res)
	s.cfg.Audit(index, res)
	s.cfg.Queue.Applied(res)
	return cmd, res, nil
}

// answerProposers hands an applied command's result to the proposer waiting for it, and to the waiting
// acquire a release carried.
func (s *State) answerProposers(index uint64, cmd *wirepb.Command, res fsm.Result) {
	if res.Handoff != nil {
		s.cfg.Answer(cmd.GetReleaseHandoff().GetAcquireProposalId(), index, *res.Handoff)
	}
	s.cfg.Answer(cmd.GetProposalId(), index, res)
}
