package server

import (
	"crypto/rand"
	"encoding/binary"
	"sync"

	"github.com/leased/leased/fsm"
)

// proposalOutcome is what the proposer of an entry learns when it applies, or err when it will not learn it
// (this node stopped leading; the entry may still commit under the next leader).
type proposalOutcome struct {
	index  uint64
	result fsm.Result
	err    error
	// refused: raft dropped the proposal (err says why); it never entered the log.
	refused bool
}

// proposalWaiter matches applied entries to the goroutines that proposed them, by proposal id. Ids start
// at a random base per process so that ids of other nodes and earlier runs do not collide.
type proposalWaiter struct {
	mu      sync.Mutex
	next    uint64
	waiting map[uint64]chan proposalOutcome
}

func newProposalWaiter() *proposalWaiter {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &proposalWaiter{next: binary.BigEndian.Uint64(b[:]) | 1, waiting: make(map[uint64]chan proposalOutcome)}
}

func (w *proposalWaiter) register() (uint64, <-chan proposalOutcome) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.next++
	if w.next == 0 {
		w.next = 1
	}
	ch := make(chan proposalOutcome, 1)
	w.waiting[w.next] = ch
	return w.next, ch
}

func (w *proposalWaiter) cancel(id uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.waiting, id)
}

func (w *proposalWaiter) deliver(id uint64, out proposalOutcome) {
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

// failAll answers every waiting proposer with err.
func (w *proposalWaiter) failAll(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, ch := range w.waiting {
		ch <- proposalOutcome{err: err} // buffered, and each channel is answered once
		delete(w.waiting, id)
	}
}
