package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/raft/v3"
	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/fsm"
)

// How requests reach raft: writes are proposed and answered once applied; reads and renewals wait for a
// ReadIndex round.

// propose appends cmd to the log and waits until it is applied, returning the FSM's result and the entry's
// index. A timeout leaves the outcome unknown (ErrTimeout); Acquire's request id makes a retry safe.
// The Ready loop steps the proposal (raftHost); a refusal by raft comes back through the proposal waiter.
func (n *node) propose(ctx context.Context, cmd *wirepb.Command) (res fsm.Result, index uint64, err error) {
	entered := false // the command may be in the log: a failure from then on is not a refusal
	defer func() { n.metrics.proposed(entered, err) }()
	if err := n.stoppedErr(); err != nil {
		return fsm.Result{}, 0, err
	}
	id, ch := n.proposals.register()
	defer n.proposals.cancel(id)
	cmd.ProposalId = id
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(cmd)
	if err != nil {
		return fsm.Result{}, 0, fmt.Errorf("encode command: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, n.cfg.ProposalTimeout)
	defer cancel()
	if err := n.raft.propose(ctx, proposal{data: data, id: id}); err != nil {
		return fsm.Result{}, 0, n.proposeErr(ctx, err) // never queued: stopped, or the queue stayed full
	}
	entered = true
	// From here on the entry may be in the log: any answer but its Result or raft's refusal leaves the
	// outcome unknown.
	select {
	case out := <-ch:
		if out.refused {
			entered = false
			return fsm.Result{}, 0, n.proposeErr(ctx, out.err) // never entered the log
		}
		return out.result, out.index, out.err
	case <-ctx.Done():
		return fsm.Result{}, 0, unknownOutcome(n.proposeErr(ctx, ctx.Err()))
	case <-n.done: // closed, or stopped by a fatal error: the entry will not apply here
		return fsm.Result{}, 0, unknownOutcome(n.stoppedErr())
	}
}

// unknownOutcome marks err as the answer to a write that may still take effect (ErrOutcomeUnknown).
func unknownOutcome(err error) error {
	if err == nil || errors.Is(err, ErrOutcomeUnknown) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
}

func (n *node) proposeErr(ctx context.Context, err error) error {
	switch {
	case errors.Is(err, raft.ErrProposalDropped):
		return fmt.Errorf("proposal dropped: %w", ErrNoLeader)
	case errors.Is(err, raft.ErrStopped):
		return ErrStopped
	case ctx.Err() != nil && n.leader.Load() == raft.None:
		return fmt.Errorf("waiting for a leader: %w", ErrNoLeader)
	case ctx.Err() != nil:
		return fmt.Errorf("proposal not applied in time: %w", ErrTimeout)
	}
	return err
}

// proposeAsync appends a lessor command (its entries, in order) without waiting; the lessor observes its
// effects when it applies. A command decided in another term than the one this node now leads in is
// dropped: it may have waited in the queue across a leadership change, during which another leader
// renewed the leases it names (a checkpoint's stale remainder would let the leader after that cut them
// short). The lessor decides again.
func (n *node) proposeAsync(c lessorCmd) {
	if !n.isLeader() || n.term.Load() != c.term {
		n.log.Debug("dropping a lessor command from an earlier term", "decided_in", c.term, "term", n.term.Load())
		return
	}
	for _, cmd := range c.entries() {
		n.proposeLessorEntry(cmd, c.term)
	}
}

func (n *node) proposeLessorEntry(cmd *wirepb.Command, term uint64) {
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(cmd)
	if err != nil {
		n.log.Error("encode lessor command", "err", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), n.cfg.ProposalTimeout)
	defer cancel()
	// The loop checks the term again as it steps the command: it may wait in the queue meanwhile.
	if err := n.raft.propose(ctx, proposal{data: data, term: term}); err != nil {
		n.log.Debug("lessor proposal not accepted", "err", err)
	}
}

// linearizable waits until this node's state reflects every write committed before the call (ReadIndex).
func (n *node) linearizable(ctx context.Context) error {
	start := time.Now()
	idx, err := n.reads.readIndex(ctx)
	n.metrics.readSeconds.Observe(since(start))
	if err != nil {
		return err
	}
	if err := n.appliedWait.wait(ctx, idx, n.done); err != nil {
		return errors.Join(err, n.stoppedErr())
	}
	return nil
}

// confirmLeadership returns nil only if this node was the leader, in the same term, both before and after
// a quorum acknowledged its leadership (decision 4), and its state reflects everything committed before.
func (n *node) confirmLeadership(ctx context.Context) error {
	term := n.term.Load()
	if !n.isLeader() {
		return n.notLeaderErr()
	}
	if err := n.linearizable(ctx); err != nil {
		return err
	}
	if !n.isLeader() || n.term.Load() != term {
		return n.notLeaderErr()
	}
	return nil
}

func (n *node) notLeaderErr() error {
	if n.leader.Load() == raft.None {
		return ErrNoLeader
	}
	return ErrNotLeader
}

func (n *node) stoppedErr() error {
	if p := n.fatalErr.Load(); p != nil {
		return fmt.Errorf("%w: %v", ErrStopped, *p)
	}
	select {
	case <-n.stopped:
		return ErrStopped
	case <-n.done:
		return ErrStopped
	default:
		return nil
	}
}

// readFSM runs fn with the state machine locked for reading.
func (n *node) readFSM(fn func(sm *fsm.FSM)) {
	n.fsmMu.RLock()
	defer n.fsmMu.RUnlock()
	fn(n.sm)
}
