package fsm

import (
	"fmt"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
)

// Counting semaphores. An Acquire with limit N > 0 asks for one slot of the resource's semaphore of N
// slots. Each slot is a lease of its own: its own holder, TTL, value and fencing token (the index of the
// entry that granted it), released, renewed and expired by (resource, token) like any lease. At most N
// slots of a resource are live at any applied index (I2 for semaphores); a resource is either a plain
// lease or a semaphore, never both at once.
//
// The semaphore exists while it has a live slot: the first grant fixes N, every later Acquire must ask the
// same N (LimitMismatch otherwise, so two programs that disagree on the bound learn it instead of each
// enforcing its own), and when the last slot ends the resource is free for any limit again.
//
// Slots live in the same B-tree as plain leases, keyed (resource, token), so List walks them in resource
// then token order; a plain lease is keyed (resource, 0). The semaphores map counts the live slots of
// each semaphore resource; it is only ever looked up, never iterated, so its order cannot leak.

// MaxSemaphoreLimit is the largest number of slots a semaphore may have. It bounds the slots a Get
// returns and the scan of a resource's slots.
const MaxSemaphoreLimit = 1000

// semaphore is the state of one semaphore resource with at least one live slot.
type semaphore struct {
	limit uint32
	held  int
}

// acquireSlot grants one slot of c.Resource's semaphore if one is free.
func (f *FSM) acquireSlot(index uint64, c *wirepb.AcquireCmd) Result {
	if c.GetLimit() > MaxSemaphoreLimit || c.GetLockDelayMs() != 0 {
		return Result{Code: Invalid}
	}
	if cur, ok := f.lookup(c.Resource); ok {
		return Result{Code: LimitMismatch, Lease: cur.export()} // a plain lease holds it
	}
	if d, ok := f.delays[c.Resource]; ok {
		return Result{Code: LockDelayed, Delay: d.export(c.Resource)}
	}
	s := f.semaphores[c.Resource]
	switch {
	case s != nil && s.limit != c.Limit:
		return Result{Code: LimitMismatch, Lease: f.oldestSlot(c.Resource).export()}
	case s != nil && s.held >= int(s.limit):
		return Result{Code: Held, Lease: f.oldestSlot(c.Resource).export()}
	}
	if code := f.overLimit(c); code != OK {
		return Result{Code: code}
	}
	h := f.holders[c.Holder]
	if h == nil {
		h = newHolder(c.Holder)
		f.holders[c.Holder] = h
	}
	l := f.newLease(index, h, c)
	f.insert(l)
	f.highest = index
	granted := l.export()
	return Result{Code: OK, Lease: granted, Events: []Event{{Type: leasepb.EventType_EVENT_TYPE_GRANTED, Index: index, Lease: granted}}}
}

// slotKey is the lease's B-tree key beside its resource: its token for a slot, 0 for a plain lease.
func (l *lease) slotKey() uint64 {
	if l.limit > 0 {
		return l.token
	}
	return 0
}

// countSlot keeps the semaphores map in step with a slot that was inserted (delta 1) or removed (-1).
func (f *FSM) countSlot(l *lease, delta int) {
	if l.limit == 0 {
		return
	}
	s := f.semaphores[l.resource]
	if s == nil {
		s = &semaphore{limit: l.limit}
		f.semaphores[l.resource] = s
	}
	s.held += delta
	if s.held == 0 {
		delete(f.semaphores, l.resource)
	}
}

// slotsOf returns the live slots of resource in token order (none for a plain lease or a free resource).
func (f *FSM) slotsOf(resource string) []*lease {
	if _, ok := f.semaphores[resource]; !ok {
		return nil
	}
	var out []*lease
	f.byResource.AscendGreaterOrEqual(probe(resource, 1), func(e entry) bool {
		if e.resource != resource {
			return false
		}
		out = append(out, e.lease)
		return true
	})
	return out
}

// oldestSlot is the live slot of resource with the lowest token; resource must be a semaphore.
func (f *FSM) oldestSlot(resource string) *lease {
	var out *lease
	f.byResource.AscendGreaterOrEqual(probe(resource, 1), func(e entry) bool {
		if e.resource == resource {
			out = e.lease
		}
		return false
	})
	return out
}

// Slots returns the live slots of a semaphore resource in token order; nil for a plain lease or a free
// resource.
func (f *FSM) Slots(resource string) []Lease {
	slots := f.slotsOf(resource)
	if slots == nil {
		return nil
	}
	out := make([]Lease, len(slots))
	for i, l := range slots {
		out[i] = l.export()
	}
	return out
}

// Full reports whether an acquire of resource can only be answered "held" (unless it replays a grant):
// a plain lease is live, or every slot of its semaphore is.
func (f *FSM) Full(resource string) bool {
	if s, ok := f.semaphores[resource]; ok {
		return uint32(len(f.slotsOf(resource))) >= s.limit
	}
	_, held := f.Get(resource)
	return held
}

// SemaphoreLimit returns the limit of resource's semaphore and whether it is one (has a live slot).
func (f *FSM) SemaphoreLimit(resource string) (uint32, bool) {
	s, ok := f.semaphores[resource]
	if !ok {
		return 0, false
	}
	return s.limit, true
}

// checkSlot checks a snapshot's lease record r, which follows prev, against the semaphore rules: the
// slots of a resource share one limit, never outnumber it, carry no lock-delay, and follow no plain
// lease of the same resource (checkRecord has ordered them).
func (f *FSM) checkSlot(r, prev *record) error {
	if r.limit == 0 {
		return nil
	}
	s := f.semaphores[r.resource]
	switch {
	case r.limit > MaxSemaphoreLimit || r.lockDelayMs != 0:
		return fmt.Errorf("%w: slot %q token %d has limit %d and lock-delay %d", ErrBadSnapshot, r.resource, r.token, r.limit, r.lockDelayMs)
	case prev.resource == r.resource && prev.limit != r.limit:
		return fmt.Errorf("%w: slots of %q disagree on the limit (%d, %d)", ErrBadSnapshot, r.resource, prev.limit, r.limit)
	case s != nil && s.held >= int(s.limit):
		return fmt.Errorf("%w: %q has more than its %d slots", ErrBadSnapshot, r.resource, s.limit)
	}
	return nil
}
