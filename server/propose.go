package server

import (
	"context"
	"log/slog"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server/internal/lessor"
	"github.com/leased/leased/server/internal/raftnode"
)

// How requests reach raft (internal/raftnode): writes are proposed and answered once applied; reads and
// renewals wait for a ReadIndex round (opsNode's other methods, leaseops.go).

// Propose appends cmd to the log and waits until it is applied, returning the FSM's result and the entry's
// index. A timeout leaves the outcome unknown (ErrTimeout); Acquire's request id makes a retry safe.
func (a opsNode) Propose(ctx context.Context, cmd *wirepb.Command) (fsm.Result, uint64, error) {
	out, entered, err := a.proposals.Propose(ctx, a.raft, func(id uint64) ([]byte, error) {
		cmd.ProposalId = id
		return proto.MarshalOptions{Deterministic: true}.Marshal(cmd)
	})
	a.metrics.proposed(entered, err)
	if err != nil {
		return fsm.Result{}, 0, err
	}
	return out.Result, out.Index, nil
}

// lessorRaft is what proposing the lessor's commands needs of raft (raftnode.Node; tests replace it).
type lessorRaft interface {
	IsLeader() bool
	Term() uint64
	Propose(ctx context.Context, p raftnode.Proposal) error
	Done() <-chan struct{}
}

// lessorProposer proposes the lessor's commands (proposeAsync).
type lessorProposer struct {
	raft      lessorRaft
	proposals *raftnode.Waiter[fsm.Result]
	timeout   time.Duration // Config.ProposalTimeout
	log       *slog.Logger
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
func (p *lessorProposer) proposeAsync(c lessor.Cmd) {
	if !p.raft.IsLeader() || p.raft.Term() != c.Term {
		p.log.Debug("dropping a lessor command from an earlier term", "decided_in", c.Term, "term", p.raft.Term())
		return
	}
	var window []lessorEntry
	defer func() {
		for _, e := range window {
			p.proposals.Cancel(e.id)
		}
	}()
	for _, cmd := range c.Entries() {
		if len(window) == lessorWindow {
			if !p.awaitLessorEntry(window[0]) {
				return
			}
			window = window[1:]
		}
		e, ok := p.proposeLessorEntry(cmd, c.Term)
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
	out <-chan raftnode.Outcome[fsm.Result]
}

// proposeLessorEntry queues cmd for the log, tagged with the term it was decided in (the loop drops it if
// this node no longer leads in that term); ok is false if it could not be queued.
func (p *lessorProposer) proposeLessorEntry(cmd *wirepb.Command, term uint64) (e lessorEntry, ok bool) {
	e.id, e.out = p.proposals.Register()
	cmd.ProposalId = e.id
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(cmd)
	if err != nil {
		p.proposals.Cancel(e.id)
		p.log.Error("encode lessor command", "err", err)
		return e, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.timeout)
	defer cancel()
	if err := p.raft.Propose(ctx, raftnode.Proposal{Data: data, ID: e.id, Term: term}); err != nil {
		p.proposals.Cancel(e.id)
		p.log.Debug("lessor proposal not accepted", "err", err)
		return e, false
	}
	return e, true
}

// awaitLessorEntry waits until e applies on this node, and reports whether it did.
func (p *lessorProposer) awaitLessorEntry(e lessorEntry) bool {
	timeout := time.NewTimer(p.timeout)
	defer timeout.Stop()
	select {
	case out := <-e.out:
		if out.Err != nil || out.Refused {
			p.log.Debug("lessor entry not applied", "err", out.Err)
			return false
		}
		return true
	case <-timeout.C: // proposeAsync cancels the waiters it still holds
		return false
	case <-p.raft.Done():
		return false
	}
}
