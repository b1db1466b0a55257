package server

import (
	"sync"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/fsm"
)

// waitQueue holds blocking acquires, FIFO per resource, on the leader. Only the head of a resource's queue
// tries to acquire; it is woken when the resource frees (a release, an expiry, the end of a lock-delay) or
// when the waiter ahead of it leaves. Losing leadership fails every waiter with Unavailable, and the client
// retries on the new leader with the same request id.
//
// The queue is bounded (decision 14): at most maxTotal waiters in all (--max-waiters) and maxPerResource
// for one resource (--max-waiters-per-resource); enqueue refuses past either.
type waitQueue struct {
	mu             sync.Mutex
	queues         map[string][]*waiter
	total          int
	maxTotal       int
	maxPerResource int
}

type waiter struct {
	wake chan struct{} // capacity 1: a wake-up is never lost and never blocks the apply loop
	err  error         // set, under the queue's lock, when the waiter is failed
}

func newWaitQueue(maxTotal, maxPerResource int) *waitQueue {
	return &waitQueue{queues: make(map[string][]*waiter), maxTotal: maxTotal, maxPerResource: maxPerResource}
}

// len is the number of waiters (leased_waiters).
func (q *waitQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.total
}

// enqueue appends a waiter for resource, or refuses past a limit.
func (q *waitQueue) enqueue(resource string) (*waiter, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.total >= q.maxTotal:
		return nil, limited("--max-waiters", "the leader queues %d blocking acquires, the most it may", q.maxTotal)
	case len(q.queues[resource]) >= q.maxPerResource:
		return nil, limited("--max-waiters-per-resource", "%d blocking acquires wait for %q, the most that may", q.maxPerResource, resource)
	}
	w := &waiter{wake: make(chan struct{}, 1)}
	q.queues[resource] = append(q.queues[resource], w)
	q.total++
	return w, nil
}

// head reports whether w may try to acquire now, or the error it was failed with.
func (q *waitQueue) head(resource string, w *waiter) (bool, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if w.err != nil {
		return false, w.err
	}
	ws := q.queues[resource]
	return len(ws) > 0 && ws[0] == w, nil
}

// leave removes w (granted, cancelled or failed) and wakes the next waiter, which is now the head.
func (q *waitQueue) leave(resource string, w *waiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	ws := q.queues[resource]
	for i, x := range ws {
		if x == w {
			ws = append(ws[:i:i], ws[i+1:]...)
			q.total--
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
}

func notify(w *waiter) {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}
