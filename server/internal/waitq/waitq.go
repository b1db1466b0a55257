// Package waitq holds the leader's blocking acquires: a FIFO queue per resource whose head is woken to
// try when the resource frees, with the claims a release takes to hand the resource to the head waiter in
// its own entry (Queue, "Handoff"). It knows nothing of raft or of how an acquire is proposed: the lease
// service asks it who may try and tells it what each applied entry freed.
package waitq

import (
	"sync"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server/internal/errs"
)

// Queue holds blocking acquires, FIFO per resource, on the leader. Only the head of a resource's queue
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
// identity (--max-waiters-per-identity); Enqueue refuses past any.
type Queue struct {
	mu             sync.Mutex
	queues         map[string][]*Waiter
	total          int
	perIdentity    map[string]int // waiters by their command's identity; "" is not counted
	maxTotal       int
	maxPerResource int
	maxPerIdentity int
}

// Waiter is one blocking acquire in a Queue.
type Waiter struct {
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

// New returns an empty queue with the given limits (--max-waiters, --max-waiters-per-resource,
// --max-waiters-per-identity).
func New(maxTotal, maxPerResource, maxPerIdentity int) *Queue {
	return &Queue{queues: make(map[string][]*Waiter), perIdentity: make(map[string]int),
		maxTotal: maxTotal, maxPerResource: maxPerResource, maxPerIdentity: maxPerIdentity}
}

// Len is the number of waiters (leased_waiters).
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.total
}

// Waiting is the number of waiters queued for resource.
func (q *Queue) Waiting(resource string) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.queues[resource])
}

// Enqueue appends a waiter for resource, or refuses past a limit. cmd and proposal (see Waiter) make it
// claimable by a release; a nil cmd never is.
func (q *Queue) Enqueue(resource string, cmd *wirepb.AcquireCmd, proposal uint64) (*Waiter, error) {
	identity := cmd.GetIdentity()
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.total >= q.maxTotal:
		return nil, errs.Limited("--max-waiters", "the leader queues %d blocking acquires, the most it may", q.maxTotal)
	case len(q.queues[resource]) >= q.maxPerResource:
		return nil, errs.Limited("--max-waiters-per-resource", "%d blocking acquires wait for %q, the most that may", q.maxPerResource, resource)
	case identity != "" && q.perIdentity[identity] >= q.maxPerIdentity:
		return nil, errs.Limited("--max-waiters-per-identity", "identity %q has %d blocking acquires queued, the most one identity may", identity, q.maxPerIdentity)
	}
	w := &Waiter{wake: make(chan struct{}, 1), cmd: cmd, proposal: proposal}
	q.queues[resource] = append(q.queues[resource], w)
	q.total++
	if identity != "" {
		q.perIdentity[identity]++
	}
	return w, nil
}

// Head reports whether w may try to acquire now (it heads the queue and no release carries its grant),
// or the error it was failed with.
func (q *Queue) Head(resource string, w *Waiter) (bool, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if w.err != nil {
		return false, w.err
	}
	ws := q.queues[resource]
	return len(ws) > 0 && ws[0] == w && !w.claimed, nil
}

// Begin marks w as proposing its own Acquire, so that no release claims it until End; it refuses if a
// release claimed it since Head said it may try (that release's entry will answer it).
func (q *Queue) Begin(w *Waiter) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if w.claimed || w.err != nil {
		return false
	}
	w.trying = true
	return true
}

// End ends what Begin began.
func (q *Queue) End(w *Waiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	w.trying = false
}

// Claim claims the head waiter of resource for a release to carry its Acquire, if it is claimable: it
// has a command and a proposal id, and is neither trying nor claimed already. It returns nil otherwise.
func (q *Queue) Claim(resource string) *Waiter {
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

// Carried is the Acquire and proposal id a claimed waiter's release carries.
func (q *Queue) Carried(w *Waiter) (*wirepb.AcquireCmd, uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return w.cmd, w.proposal
}

// Unclaim returns a claimed waiter to waiting when the release that claimed it never entered the log,
// and wakes it to look again.
func (q *Queue) Unclaim(w *Waiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	w.claimed = false
	notify(w)
}

// Rearm makes w claimable again under a new proposal id, after the entry that carried its Acquire
// refused it (the resource was not free after all), and wakes it.
func (q *Queue) Rearm(w *Waiter, proposal uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	w.claimed, w.proposal = false, proposal
	notify(w)
}

// Leave removes w (granted, cancelled or failed) and wakes the next waiter, which is now the head.
func (q *Queue) Leave(resource string, w *Waiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.leaveLocked(resource, w)
}

// Withdraw removes w, whose wait ended (AcquireRequest.wait_ms), unless a release carries its Acquire:
// then that entry's outcome is w's answer, and w stays until it is known. It reports whether w left.
func (q *Queue) Withdraw(resource string, w *Waiter) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if w.claimed {
		return false
	}
	q.leaveLocked(resource, w)
	return true
}

func (q *Queue) leaveLocked(resource string, w *Waiter) {
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

// Applied wakes the head waiter of every resource an applied entry freed: a release, an expiry (of a
// lease or of one semaphore slot), the end of a lock-delay. A head granted a slot leaves, which wakes
// the next waiter to try for another free slot.
func (q *Queue) Applied(res fsm.Result) {
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

func (q *Queue) wakeHead(resource string) {
	if ws := q.queues[resource]; len(ws) > 0 {
		notify(ws[0])
	}
}

// FailAll fails every waiter, e.g. when this node stops leading, and empties the queue. A claimed
// waiter is not failed: the release carrying its Acquire may still commit under the next leader, so its
// answer is that entry's outcome (or that the outcome is unknown), which its proposal id delivers.
func (q *Queue) FailAll(err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for r, ws := range q.queues {
		for _, w := range ws {
			if !w.claimed {
				w.err = err
				notify(w)
			}
		}
		delete(q.queues, r)
	}
	q.total = 0
	clear(q.perIdentity)
}

// uncount takes a leaving waiter off its identity's count.
func (q *Queue) uncount(w *Waiter) {
	id := w.cmd.GetIdentity()
	if id == "" {
		return
	}
	if q.perIdentity[id]--; q.perIdentity[id] <= 0 {
		delete(q.perIdentity, id)
	}
}

func notify(w *Waiter) {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Wake is signalled (never lost, never blocking the apply loop) when w should look again: it may head its
// queue now, it was failed, or a claim on it ended.
func (w *Waiter) Wake() <-chan struct{} { return w.wake }
