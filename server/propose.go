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
	"github.com/leased/leased/server/internal/errs"
	"github.com/leased/leased/server/internal/lessor"
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
		return fsm.Result{}, 0, errs.UnknownOutcome(n.proposeErr(ctx, ctx.Err()))
	case <-n.done: // closed, or stopped by a fatal error: the entry will not apply here
		return fsm.Result{}, 0, errs.UnknownOutcome(n.stoppedErr())
	}
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

// proposeAsync appends a lessor command (its entries, in order) without waiting for the last of them;
// the lessor observes its effects when they apply. A command decided in another term than the one this
// node now leads in is dropped: it may have waited in the queue across a leadership change, during which
// another leader renewed the leases it names (a checkpoint's stale remainder would let the leader after
// that cut them short). The lessor decides again.
//
// At most lessorWindow of a command's entries are in the log unapplied at a time: a client's write
// proposed meanwhile is appended behind those few, not behind the whole command. A mass disconnect's
// checkpoints (a thousand entries at a million leases) proposed in one go held every write that came
// after them for as long as all of them took to apply on each node. An entry that will not apply here
// (refused, this node no longer leads, the node stopped, the proposal timeout) ends the command: the
// lessor proposes what was lost again (checkpointLost; an expiry's retry).
func (n *node) proposeAsync(c lessor.Cmd) {
	if !n.isLeader() || n.term.Load() != c.Term {
		n.log.Debug("dropping a lessor command from an earlier term", "decided_in", c.Term, "term", n.term.Load())
		return
	}
	var window []lessorEntry
	defer func() {
		for _, e := range window {
			n.proposals.cancel(e.id)
		}
	}()
	for _, cmd := range c.Entries() {
		if len(window) == lessorWindow {
			if !n.awaitLessorEntry(window[0]) {
				return
			}
			window = window[1:]
		}
		e, ok := n.proposeLessorEntry(cmd, c.Term)
		if !ok {
			return
		}
		window = append(window, e)
	}
}

// lessorWindow is how many entries of one lessor command may wait to apply at once. Each holds up to
// --expiry-batch leases (1,000: one to a few ms of each node's loop). In BenchmarkMassCheckpoint at a
// million leases 16 and 64 applied the storm equally fast (3.5 s, against 1.6 s unpaced: the nodes no
// longer append the whole storm before applying any of it), and 16 kept the worst unrelated acquire
// lower (232 against 405 ms; unpaced 1.8 s); at 100,000 leases 4 made the storm twice as slow as 16.
const lessorWindow = 16

// lessorEntry is a lessor entry proposed and not yet seen to apply: its proposal id and where its outcome
// comes.
type lessorEntry struct {
	id  uint64
	out <-chan proposalOutcome
}

// proposeLessorEntry queues cmd for the log, tagged with the term it was decided in (the loop drops it if
// this node no longer leads in that term); ok is false if it could not be queued.
func (n *node) proposeLessorEntry(cmd *wirepb.Command, term uint64) (e lessorEntry, ok bool) {
	e.id, e.out = n.proposals.register()
	cmd.ProposalId = e.id
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(cmd)
	if err != nil {
		n.proposals.cancel(e.id)
		n.log.Error("encode lessor command", "err", err)
		return e, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), n.cfg.ProposalTimeout)
	defer cancel()
	if err := n.raft.propose(ctx, proposal{data: data, id: e.id, term: term}); err != nil {
		n.proposals.cancel(e.id)
		n.log.Debug("lessor proposal not accepted", "err", err)
		return e, false
	}
	return e, true
}

// awaitLessorEntry waits until e applies on this node, and reports whether it did.
func (n *node) awaitLessorEntry(e lessorEntry) bool {
	timeout := time.NewTimer(n.cfg.ProposalTimeout)
	defer timeout.Stop()
	select {
	case out := <-e.out:
		if out.err != nil || out.refused {
			n.log.Debug("lessor entry not applied", "err", out.err)
			return false
		}
		return true
	case <-timeout.C: // proposeAsync cancels the waiters it still holds
		return false
	case <-n.done:
		return false
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
	if err := n.state.WaitApplied(ctx, idx, n.done); err != nil {
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
