package rpc

import (
	"crypto/rand"
	"encoding/binary"
	"sync"

	"github.com/leased/leased/fsm"
)

// A blocking acquire may be granted by the entry of a release that carried it (internal/waitq,
// "Handoff"), not by an entry of its own: it registers here, its id travels in the queue and then in the
// release's entry (ReleaseHandoffCmd.acquire_proposal_id), and the apply answers it by that id
// (DeliverCarried). Ids start at a random base per process, as the node's proposal ids do, so that ids of
// other nodes and earlier runs do not collide.

// carriedOutcome is what a queued acquire learns when the entry carrying its grant applied, or err when
// it will not learn it (this node stopped leading; the entry may still commit under the next leader).
type carriedOutcome struct {
	result fsm.Result
	err    error
}

// carriedWaits matches applied entries to the queued acquires they carried, by id.
type carriedWaits struct {
	mu      sync.Mutex
	next    uint64
	waiting map[uint64]chan carriedOutcome
}

func newCarriedWaits() *carriedWaits {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &carriedWaits{next: binary.BigEndian.Uint64(b[:]) | 1, waiting: make(map[uint64]chan carriedOutcome)}
}

func (w *carriedWaits) register() (uint64, <-chan carriedOutcome) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.next++
	if w.next == 0 {
		w.next = 1
	}
	ch := make(chan carriedOutcome, 1)
	w.waiting[w.next] = ch
	return w.next, ch
}

func (w *carriedWaits) cancel(id uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.waiting, id)
}

// DeliverCarried answers the queued acquire registered under id with the result of the entry that
// carried it; ids it does not know (another proposer's, or 0) are ignored. It never blocks: the apply
// loop calls it.
func (o *LeaseOps) DeliverCarried(id uint64, res fsm.Result) {
	w := o.carried
	if id == 0 {
		return
	}
	w.mu.Lock()
	ch, ok := w.waiting[id]
	delete(w.waiting, id)
	w.mu.Unlock()
	if ok {
		ch <- carriedOutcome{result: res} // buffered: never blocks the apply loop
	}
}

// FailCarried answers every registered acquire with err: this node stopped leading, and the entries
// carrying them may be lost or commit under the next leader.
func (o *LeaseOps) FailCarried(err error) {
	w := o.carried
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, ch := range w.waiting {
		ch <- carriedOutcome{err: err} // buffered, and each channel is answered once
		delete(w.waiting, id)
	}
}
