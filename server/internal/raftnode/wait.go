package raftnode

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/leased/leased/server/internal/errs"
)

// Outcome is what the proposer of an entry learns when it applies (the applier's Result R and the entry's
// Index), or Err when it will not learn it (this node stopped leading; the entry may still commit under
// the next leader).
type Outcome[R any] struct {
	Index  uint64
	Result R
	Err    error
	// Refused: raft dropped the proposal (Err says why); it never entered the log.
	Refused bool
}

// Waiter matches applied entries to the goroutines that proposed them, by proposal id. Ids start at a
// random base per process so that ids of other nodes and earlier runs do not collide. The layer that
// applies the entries delivers their results (Deliver); the Ready loop tells of refusals and of a lost
// leadership (Config.Proposers).
type Waiter[R any] struct {
	mu      sync.Mutex
	next    uint64
	waiting map[uint64]chan Outcome[R]
}

// NewWaiter returns a Waiter with nobody waiting.
func NewWaiter[R any]() *Waiter[R] {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &Waiter[R]{next: binary.BigEndian.Uint64(b[:]) | 1, waiting: make(map[uint64]chan Outcome[R])}
}

// Register returns a new proposal id and where its outcome comes (once).
func (w *Waiter[R]) Register() (uint64, <-chan Outcome[R]) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.next++
	if w.next == 0 {
		w.next = 1
	}
	ch := make(chan Outcome[R], 1)
	w.waiting[w.next] = ch
	return w.next, ch
}

// Cancel forgets id: an outcome that comes later goes nowhere.
func (w *Waiter[R]) Cancel(id uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.waiting, id)
}

// Deliver hands out to the proposer of id, if it still waits.
func (w *Waiter[R]) Deliver(id uint64, out Outcome[R]) {
	if id == 0 {
		return
	}
	w.mu.Lock()
	ch, ok := w.waiting[id]
	delete(w.waiting, id)
	w.mu.Unlock()
	if ok {
		ch <- out // buffered: never blocks the apply loop
	}
}

// Waiting is how many proposers wait.
func (w *Waiter[R]) Waiting() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.waiting)
}

// Refuse tells the proposer of id that raft dropped its proposal.
func (w *Waiter[R]) Refuse(id uint64, err error) { w.Deliver(id, Outcome[R]{Err: err, Refused: true}) }

// FailAll answers every waiting proposer with err.
func (w *Waiter[R]) FailAll(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, ch := range w.waiting {
		ch <- Outcome[R]{Err: err} // buffered, and each channel is answered once
		delete(w.waiting, id)
	}
}

// Propose appends the entry encode makes for a new proposal id to n's log and waits until it is applied,
// returning its outcome. A timeout (Config.ProposalTimeout) leaves the outcome unknown (errs.ErrTimeout).
// entered reports whether the entry may be in the log: a failure from then on is not a refusal.
func (w *Waiter[R]) Propose(ctx context.Context, n *Node, encode func(id uint64) ([]byte, error)) (out Outcome[R], entered bool, err error) {
	if err := n.StoppedErr(); err != nil {
		return out, false, err
	}
	id, ch := w.Register()
	defer w.Cancel(id)
	data, err := encode(id)
	if err != nil {
		return out, false, fmt.Errorf("encode command: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, n.cfg.ProposalTimeout)
	defer cancel()
	if err := n.Propose(ctx, Proposal{Data: data, ID: id}); err != nil {
		return out, false, n.ProposeErr(ctx, err) // never queued: stopped, or the queue stayed full
	}
	// From here on the entry may be in the log: any answer but its Result or raft's refusal leaves the
	// outcome unknown.
	select {
	case out := <-ch:
		if out.Refused {
			return out, false, n.ProposeErr(ctx, out.Err) // never entered the log
		}
		return out, true, out.Err
	case <-ctx.Done():
		return out, true, errs.UnknownOutcome(n.ProposeErr(ctx, ctx.Err()))
	case <-n.done: // closed, or stopped by a fatal error: the entry will not apply here
		return out, true, errs.UnknownOutcome(n.StoppedErr())
	}
}
