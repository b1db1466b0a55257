package server

import (
	"sync"
	"sync/atomic"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/fsm"
)

// waitQueue holds blocking acquires, FIFO per resource, on the leader. Only the head of a resource's queue
// tries to acquire; it is woken when the resource frees (a release, an expiry, the end of a lock-delay) or
// when the waiter ahead of it leaves. Losing leadership fails every waiter with Unavailable, and the client
// retries on the new leader with the same request id.
//
// Handoff: a Release of a resource whose head waiter is idle claims that waiter and carries its Acquire in
// the release's own entry (a ReleaseHandoff), so one entry both frees the resource and grants it to the
// head; the waiter is answered from that entry's apply. A claimed waiter proposes nothing of its own until
// the outcome is known, and a waiter that is proposing its own Acquire is not claimed, so no waiter has two
// grants in flight at once.
//
// The queue is bounded (decision 14): at most maxTotal waiters in all (--max-waiters), maxPerResource
// for one resource (--max-waiters-per-resource) and, with client authentication, maxPerIdentity of one
// identity (--max-waiters-per-identity); enqueue refuses past any.
type waitQueue struct {
	mu             sync.Mutex
	queues         map[string][]*waiter
	total          int
	perIdentity    map[string]int // waiters by their command's identity; "" is not counted
	maxTotal       int
	maxPerResource int
	maxPerIdentity int
}

type waiter struct {
	wake chan struct{} // capacity 1: a wake-up is never lost and never blocks the apply loop
	err  error         // set, under the queue's lock, when the waiter is failed

	// The fields below are guarded by the queue's lock.
	// cmd is the Acquire a release may carry for this waiter, proposal the proposal id under which the
	// entry's apply answers it (0: not registered, so not claimable).
	cmd      *wirepb.AcquireCmd
	proposal uint64
	// trying: the waiter is proposing its own Acquire. claimed: a release carrying its Acquire was
	// proposed, and its outcome is not known yet. Never both at once.
	trying, claimed bool
}

func newWaitQueue(maxTotal, maxPerResource, maxPerIdentity int) *waitQueue {
	return &waitQueue{queues: make(map[string][]*waiter), perIdentity: make(map[string]int),
		maxTotal: maxTotal, maxPerResource: maxPerResource, maxPerIdentity: maxPerIdentity}
}

// len is the number of waiters (leased_waiters).
func (q *waitQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.total
}

// enqueue appends a waiter for resource, or refuses past a limit. cmd and proposal (see waiter) make it
// claimable by a release; a nil cmd never is.
func (q *waitQueue) enqueue(resource string, cmd *wirepb.AcquireCmd, proposal uint64) (*waiter, error) {
	identity := cmd.GetIdentity()
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.total >= q.maxTotal:
		return nil, limited("--max-waiters", "the leader queues %d blocking acquires, the most it may", q.maxTotal)
	case len(q.queues[resource]) >= q.maxPerResource:
		return nil, limited("--max-waiters-per-resource", "%d blocking acquires wait for %q, the most that may", q.maxPerResource, resource)
	case identity != "" && q.perIdentity[identity] >= q.maxPerIdentity:
		return nil, limited("--max-waiters-per-identity", "identity %q has %d blocking acquires queued, the most one identity may", identity, q.maxPerIdentity)
	}
	w := &waiter{wake: make(chan struct{}, 1), cmd: cmd, proposal: proposal}
	q.queues[resource] = append(q.queues[resource], w)
	q.total++
	if identity != "" {
		q.perIdentity[identity]++
	}
	return w, nil
}

// head reports whether w may try to acquire now (it heads the queue and no release carries its grant),
// or the error it was failed with.
func (q *waitQueue) head(resource string, w *waiter) (bool, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if w.err != nil {
		return false, w.err
	}
	ws := q.queues[resource]
	return len(ws) > 0 && ws[0] == w && !w.claimed, nil
}

// begin marks w as proposing its own Acquire, so that no release claims it until end; it refuses if a
// release claimed it since head said it may try (that release's entry will answer it).
func (q *waitQueue) begin(w *waiter) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if w.claimed || w.err != nil {
		return false
	}
	w.trying = true
	return true
}

// end ends what begin began.
func (q *waitQueue) end(w *waiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	w.trying = false
}

// claim claims the head waiter of resource for a release to carry its Acquire, if it is claimable: it
// has a command and a proposal id, and is neither trying nor claimed already. It returns nil otherwise.
func (q *waitQueue) claim(resource string) *waiter {
	q.mu.Lock()
	defer q.mu.Unlock()
	ws := q.queues[resource]
	if len(ws) == 0 {
		return nil
	}
	w := ws[0]
	if w.cmd == nil || w.proposal == 0 || w.trying || w.claimed || w.err != nil {
		return nil
	}
	w.claimed = true
	return w
}

// carried is the Acquire and proposal id a claimed waiter's release carries.
func (q *waitQueue) carried(w *waiter) (*wirepb.AcquireCmd, uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return w.cmd, w.proposal
}

// unclaim returns a claimed waiter to waiting when the release that claimed it never entered the log,
// and wakes it to look again.
func (q *waitQueue) unclaim(w *waiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	w.claimed = false
	notify(w)
}

// rearm makes w claimable again under a new proposal id, after the entry that carried its Acquire
// refused it (the resource was not free after all), and wakes it.
func (q *waitQueue) rearm(w *waiter, proposal uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	w.claimed, w.proposal = false, proposal
	notify(w)
}

// leave removes w (granted, cancelled or failed) and wakes the next waiter, which is now the head.
func (q *waitQueue) leave(resource string, w *waiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.leaveLocked(resource, w)
}

// withdraw removes w, whose wait ended (AcquireRequest.wait_ms), unless a release carries its Acquire:
// then that entry's outcome is w's answer, and w stays until it is known. It reports whether w left.
func (q *waitQueue) withdraw(resource string, w *waiter) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if w.claimed {
		return false
	}
	q.leaveLocked(resource, w)
	return true
}

func (q *waitQueue) leaveLocked(resource string, w *waiter) {
	ws := q.queues[resource]
	for i, x := range ws {
		if x == w {
			ws = append(ws[:i:i], ws[i+1:]...)
			q.total--
			q.uncount(w)
			break
		}
	}
	if len(ws) == 0 {
		delete(q.queues, resource)
		return
	}
	q.queues[resource] = ws
	notify(ws[0])
}

// applied wakes the head waiter of every resource an applied entry freed: a release, an expiry (of a
// lease or of one semaphore slot), the end of a lock-delay. A head granted a slot leaves, which wakes
// the next waiter to try for another free slot.
func (q *waitQueue) applied(res fsm.Result) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.queues) == 0 {
		return
	}
	for _, e := range res.Events {
		if e.Type == leasepb.EventType_EVENT_TYPE_RELEASED || e.Type == leasepb.EventType_EVENT_TYPE_EXPIRED {
			q.wakeHead(e.Lease.Resource)
		}
	}
	for _, d := range res.Changes.DelaysEnded {
		q.wakeHead(d.Resource)
	}
}

func (q *waitQueue) wakeHead(resource string) {
	if ws := q.queues[resource]; len(ws) > 0 {
		notify(ws[0])
	}
}

// failAll fails every waiter, e.g. when this node stops leading.
func (q *waitQueue) failAll(err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for r, ws := range q.queues {
		for _, w := range ws {
			w.err = err
			notify(w)
		}
		delete(q.queues, r)
	}
	q.total = 0
	clear(q.perIdentity)
}

// uncount takes a leaving waiter off its identity's count.
func (q *waitQueue) uncount(w *waiter) {
	id := w.cmd.GetIdentity()
	if id == "" {
		return
	}
	if q.perIdentity[id]--; q.perIdentity[id] <= 0 {
		delete(q.perIdentity, id)
	}
}

func notify(w *waiter) {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// testHooks are points where a test may step in; all nil outside tests.
type testHooks struct {
	// handoffProposing runs after a release claimed a waiter and before it proposes the entry that
	// carries the waiter's grant, on the release's goroutine.
	handoffProposing atomic.Pointer[func()]
}
