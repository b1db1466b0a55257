package server

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server/internal/lessor"
	"github.com/leased/leased/server/internal/raftnode"
)

// fakeLead is the leadership a lessorRaft stand-in reports: the term, and whether this node leads in it.
type fakeLead struct {
	term    atomic.Uint64
	leading atomic.Bool
	done    chan struct{}
}

func (f *fakeLead) IsLeader() bool        { return f.leading.Load() }
func (f *fakeLead) Term() uint64          { return f.term.Load() }
func (f *fakeLead) Done() <-chan struct{} { return f.done }

// recordingRaft is a lessorRaft that only records what is proposed to it.
type recordingRaft struct {
	*fakeLead
	proposed []*wirepb.Command
}

func (r *recordingRaft) Propose(_ context.Context, p raftnode.Proposal) error {
	cmd := &wirepb.Command{}
	if err := proto.Unmarshal(p.Data, cmd); err != nil {
		return err
	}
	r.proposed = append(r.proposed, cmd)
	return nil
}

// TestLessorCommandFromEarlierTermIsNotProposed: a command the lessor decided while leading in one term,
// still queued when the node lost leadership and won it back in a later term, never reaches the log
// (between the two terms another leader may have renewed the leases it names); one decided in the
// current term does.
func TestLessorCommandFromEarlierTermIsNotProposed(t *testing.T) {
	cfg := TestConfig()
	clock := NewManualClock()
	out := make(chan lessor.Cmd, 16)
	rr := &recordingRaft{fakeLead: &fakeLead{}}
	n := &node{cfg: cfg, log: slog.New(slog.DiscardHandler), clock: clock, lessor: lessor.New(lessorConfig(cfg), out), proposals: raftnode.NewWaiter[fsm.Result]()}
	p := &lessorProposer{raft: rr, proposals: n.proposals, timeout: cfg.ProposalTimeout, log: n.log}
	sm, index := fsm.New(), uint64(0)
	grant := func(resource string) {
		index++
		res, err := sm.Apply(index, &wirepb.Command{Op: &wirepb.Command_Acquire{Acquire: &wirepb.AcquireCmd{
			Resource: resource, Holder: "h-" + resource, TtlMs: time.Second.Milliseconds()}}})
		if err != nil {
			t.Fatal(err)
		}
		n.lessor.Applied(clock.Now(), res)
	}
	lead := func(term uint64) {
		rr.term.Store(term)
		rr.leading.Store(true)
		n.lessor.Promote(clock.Now(), term)
	}
	lead(2)
	grant("old")
	clock.Advance(2 * time.Second)
	n.lessor.Tick(clock.Now()) // decides Expire(old) in term 2; the proposer has not taken it yet

	rr.leading.Store(false) // another leader in term 3
	rr.term.Store(3)
	n.lessor.Demote()
	lead(4)
	grant("new")
	clock.Advance(2 * time.Second)
	n.lessor.Tick(clock.Now()) // decides Expire(new) in term 4 (old is queued again too)

	for len(out) > 0 {
		p.proposeAsync(<-out)
	}
	var got [][]string
	for _, cmd := range rr.proposed {
		var expired []string
		for _, ref := range cmd.GetExpire().GetLeases() {
			expired = append(expired, ref.GetResource())
		}
		got = append(got, expired)
	}
	// Term 4's expiry names both leases (old was still live when this node took over again).
	if len(got) != 1 || len(got[0]) != 2 {
		t.Fatalf("proposed expiries %v; want only the one decided in term 4, [new old] in some order", got)
	}
}

// pacedRaft is a lessorRaft that records proposals, safe to read while a proposer runs.
type pacedRaft struct {
	*fakeLead
	mu       sync.Mutex
	proposed []*wirepb.Command
}

func (r *pacedRaft) Propose(_ context.Context, p raftnode.Proposal) error {
	cmd := &wirepb.Command{}
	if err := proto.Unmarshal(p.Data, cmd); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.proposed = append(r.proposed, cmd)
	return nil
}

func (r *pacedRaft) get(i int) (*wirepb.Command, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i < len(r.proposed) {
		return r.proposed[i], len(r.proposed)
	}
	return nil, len(r.proposed)
}

// TestLessorCommandKeepsAFewEntriesUnapplied: a lessor decision of many entries reaches raft at most
// lessorWindow entries ahead of what applied — a client's write proposed meanwhile waits behind those few
// — and all of them go in order; an entry refused ends the decision (the lessor proposes what was lost again)
// and leaves no proposal waiter behind.
func TestLessorCommandKeepsAFewEntriesUnapplied(t *testing.T) {
	cfg := TestConfig()
	lead := &fakeLead{done: make(chan struct{})}
	lead.term.Store(2)
	lead.leading.Store(true)
	p := &lessorProposer{proposals: raftnode.NewWaiter[fsm.Result](), timeout: cfg.ProposalTimeout, log: slog.New(slog.DiscardHandler)}
	const entries = 2*lessorWindow + 3
	decision := func() lessor.Cmd {
		var cps []*wirepb.LeaseCheckpoint
		for i := range entries * 10 {
			cps = append(cps, &wirepb.LeaseCheckpoint{Resource: fmt.Sprintf("r/%04d", i), Token: uint64(i + 1)})
		}
		return lessor.Cmd{Term: 2, Batch: 10, Cmd: &wirepb.Command{Op: &wirepb.Command_Checkpoint{Checkpoint: &wirepb.CheckpointCmd{Leases: cps}}}}
	}
	run := func(r *pacedRaft) <-chan struct{} {
		p.raft = r
		done := make(chan struct{})
		go func() { defer close(done); p.proposeAsync(decision()) }()
		return done
	}
	proposedCount := func(r *pacedRaft, want int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for _, got := r.get(0); got != want; _, got = r.get(0) {
			if got > want || time.Now().After(deadline) {
				t.Fatalf("%d entries proposed, want %d", got, want)
			}
			time.Sleep(time.Millisecond) // poll interval
		}
	}

	r := &pacedRaft{fakeLead: lead}
	done := run(r)
	for applied := 0; applied < entries; applied++ {
		proposedCount(r, min(applied+lessorWindow, entries))
		cmd, _ := r.get(applied)
		if first := cmd.GetCheckpoint().GetLeases()[0].GetResource(); first != fmt.Sprintf("r/%04d", applied*10) {
			t.Fatalf("entry %d starts at %s: out of order", applied, first)
		}
		p.proposals.Deliver(cmd.GetProposalId(), raftnode.Outcome[fsm.Result]{Index: uint64(applied + 1)})
	}
	<-done

	r = &pacedRaft{fakeLead: lead}
	done = run(r)
	proposedCount(r, lessorWindow)
	first, _ := r.get(0)
	p.proposals.Refuse(first.GetProposalId(), ErrNotLeader)
	<-done
	if _, got := r.get(0); got != lessorWindow {
		t.Fatalf("%d entries proposed after the first was refused, want the %d already in flight", got, lessorWindow)
	}
	if left := p.proposals.Waiting(); left != 0 {
		t.Fatalf("%d proposal waiters left behind", left)
	}
}
