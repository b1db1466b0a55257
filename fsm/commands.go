package fsm

import (
	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
)

func (f *FSM) acquire(index uint64, c *wirepb.AcquireCmd) Result {
	if c.GetResource() == "" || c.GetHolder() == "" || c.GetTtlMs() <= 0 || c.GetLockDelayMs() < 0 {
		return Result{Code: Invalid}
	}
	if c.Identity != "" && !f.Allows(c.Identity, c.Resource, leasepb.Permission_PERMISSION_LEASE) {
		return Result{Code: Denied, Denial: Denial{Identity: c.Identity, Permission: leasepb.Permission_PERMISSION_LEASE, Resource: c.Resource}}
	}
	if res, ok := f.sameRequest(c); ok {
		return res
	}
	if c.GetLimit() > 0 {
		return f.acquireSlot(index, c)
	}
	if _, sem := f.semaphores[c.Resource]; sem {
		return Result{Code: LimitMismatch, Lease: f.oldestSlot(c.Resource).export()}
	}
	h := f.holders[c.Holder]
	_, delayed := f.delays[c.Resource]
	if delayed || f.overLimit(c) != OK {
		return f.refuse(c)
	}
	if h == nil {
		h = newHolder(c.Holder)
		f.holders[c.Holder] = h
	}
	l := f.newLease(index, h, c)
	// One descent of the tree for the common case, a free resource; when it was held, put the current
	// grant back and answer as refuse would.
	if old, held := f.byResource.ReplaceOrInsert(entry{l}); held {
		f.byResource.ReplaceOrInsert(old)
		if len(h.leases) == 0 {
			delete(f.holders, h.name)
		}
		return f.refuse(c)
	}
	h.add(l)
	f.countIdentity(l, 1)
	f.indexRequest(l)
	f.highest = index
	granted := l.export()
	return Result{Code: OK, Lease: granted, Events: []Event{{Type: leasepb.EventType_EVENT_TYPE_GRANTED, Index: index, Lease: granted}}}
}

// newLease is the grant of c at index to h.
func (f *FSM) newLease(index uint64, h *holder, c *wirepb.AcquireCmd) *lease {
	return &lease{
		resource:    c.Resource,
		holder:      h,
		token:       index,
		ttlMs:       durationMs(c.TtlMs),
		lockDelayMs: durationMs(c.LockDelayMs),
		value:       string(c.Value),
		requestID:   c.RequestId,
		identity:    h.sharedIdentity(c.Identity),
		epoch:       f.epoch,
		limit:       c.Limit,
		flags:       flagRenewed, // a fresh grant earns a full TTL from a new leader
	}
}

// refuse answers an acquire that cannot be granted, checking in order: the same intent retried (its
// grant, replayed), held by anyone else, in lock-delay, holder or identity at its limit.
func (f *FSM) refuse(c *wirepb.AcquireCmd) Result {
	if cur, ok := f.lookup(c.Resource); ok {
		if c.RequestId != "" && keyOf(cur) == keyOfCmd(c) && cur.requestID == c.RequestId {
			// A retry of the intent that made this grant: answer with it, unchanged (decision 5).
			return Result{Code: OK, Lease: cur.export(), Replayed: true}
		}
		return Result{Code: Held, Lease: cur.export()}
	}
	if d, ok := f.delays[c.Resource]; ok {
		return Result{Code: LockDelayed, Delay: d.export(c.Resource)}
	}
	return Result{Code: f.overLimit(c)}
}

func (f *FSM) release(index uint64, c *wirepb.ReleaseCmd) Result {
	l, ok := f.current(c.GetResource(), c.GetToken())
	if plantedReleaseIgnoresToken { // tests/chaos planted bug: a constant false unless built with -tags plantbug
		l, ok = f.lookup(c.GetResource())
	}
	if ok && c.GetIdentity() != "" {
		if d, denied := f.mayRelease(c.GetIdentity(), l); denied {
			return Result{Code: Denied, Denial: d}
		}
	}
	if !ok {
		// A retry of a release that took effect answers OK, replayed; otherwise say how the lease ended.
		end := f.ends.of(c.GetResource(), c.GetToken(), f.highest)
		if end.How == EndReleased {
			return Result{Code: OK, Replayed: true, End: end}
		}
		return Result{Code: NotCurrent, End: end}
	}
	f.remove(l)
	f.ends.add(l.resource, l.token, index, EndReleased)
	released := l.export()
	ev := Event{Type: leasepb.EventType_EVENT_TYPE_RELEASED, Index: index, Lease: released}
	if c.GetIdentity() != "" && c.GetIdentity() != l.identity {
		ev.By = c.GetIdentity() // an admin released another identity's lease
	}
	return Result{Code: OK, Lease: released, Events: []Event{ev}}
}

// releaseHandoff applies a Release and then, in the same entry, the Acquire of the head of the resource's
// blocking-acquire queue, each exactly as it would apply alone: the Acquire is refused by the usual rules
// (the release did not free the resource, a lock-delay, a full semaphore, the waiter's ACL, its request
// id) and otherwise granted with this entry's index as its token. That token exceeds every earlier token,
// and the grant is made only after the release removed the lease it replaces, so I1 and I2 hold as for
// two entries; the Result's Events are the release's, then the grant's.
func (f *FSM) releaseHandoff(index uint64, c *wirepb.ReleaseHandoffCmd) Result {
	res := f.release(index, c.GetRelease())
	if c.GetAcquire() == nil {
		return res
	}
	granted := f.acquireAttempt(index, c.GetAcquire()) // a stale attempt is not granted by a handoff either
	res.Events = append(res.Events, granted.Events...)
	res.Handoff = &granted
	return res
}

func (f *FSM) expire(index uint64, c *wirepb.ExpireCmd) Result {
	var delays []LockDelay
	events := make([]Event, 0, len(c.GetLeases())) // nearly every listed lease is still current
	for _, ref := range c.GetLeases() {
		l, ok := f.current(ref.GetResource(), ref.GetToken())
		if !ok {
			continue // already released, expired or replaced: a late expiry is harmless
		}
		f.remove(l)
		f.ends.add(l.resource, l.token, index, EndExpired)
		events = append(events, Event{Type: leasepb.EventType_EVENT_TYPE_EXPIRED, Index: index, Lease: l.export()})
		if l.lockDelayMs > 0 {
			d := lockDelay{token: l.token, index: index, delayMs: int64(l.lockDelayMs)}
			f.delays[l.resource] = d
			delays = append(delays, d.export(l.resource))
		}
	}
	return Result{Code: OK, Events: events, Changes: Changes{DelaysStarted: delays}}
}

func (f *FSM) checkpoint(c *wirepb.CheckpointCmd) Result {
	var done []Checkpoint
	for _, cp := range c.GetLeases() {
		l, ok := f.current(cp.GetResource(), cp.GetToken())
		if !ok {
			continue
		}
		l = f.writable(l)
		l.set(flagCheckpointed, true)
		l.set(flagRenewed, cp.GetRenewed())
		l.remainingMs = max(cp.GetRemainingMs(), 0)
		done = append(done, Checkpoint{Resource: l.resource, Token: l.token, RemainingMs: l.remainingMs, Renewed: cp.GetRenewed()})
	}
	return Result{Code: OK, Changes: Changes{Checkpointed: done}}
}

func (f *FSM) renew(c *wirepb.RenewCmd) Result {
	var renewed []Ref
	for _, ref := range c.GetLeases() { // stale refs are ignored
		if l, ok := f.current(ref.GetResource(), ref.GetToken()); ok {
			l = f.writable(l)
			l.set(flagRenewed, true)
			renewed = append(renewed, Ref{Resource: l.resource, Token: l.token})
		}
	}
	return Result{Code: OK, Changes: Changes{Renewed: renewed}}
}

func (f *FSM) endLockDelay(c *wirepb.EndLockDelayCmd) Result {
	var ended []Ref
	for _, ref := range c.GetDelays() {
		if d, ok := f.delays[ref.GetResource()]; ok && d.token == ref.GetToken() {
			delete(f.delays, ref.GetResource())
			ended = append(ended, Ref{Resource: ref.GetResource(), Token: d.token})
		}
	}
	return Result{Code: OK, Changes: Changes{DelaysEnded: ended}}
}

// proclaim replaces the value of a current lease, keeping its token and TTL. It is checked like a
// release: the lease's own identity, or admin on the resource for another's.
func (f *FSM) proclaim(index uint64, c *wirepb.ProclaimCmd) Result {
	l, ok := f.current(c.GetResource(), c.GetToken())
	if !ok {
		return Result{Code: NotCurrent, End: f.ends.of(c.GetResource(), c.GetToken(), f.highest)}
	}
	if c.GetIdentity() != "" {
		if d, denied := f.mayRelease(c.GetIdentity(), l); denied {
			return Result{Code: Denied, Denial: d}
		}
	}
	l = f.writable(l)
	l.value = string(c.GetValue())
	l.set(flagProclaimed, true)
	changed := l.export()
	return Result{Code: OK, Lease: changed, Events: []Event{{Type: leasepb.EventType_EVENT_TYPE_VALUE_CHANGED, Index: index, Lease: changed}}}
}

// insert adds a lease known not to collide with a live one (a slot, or snapshot restore).
func (f *FSM) insert(l *lease) {
	f.place(l)
	f.indexRequest(l)
}

// place is insert but for the request index: a restore indexes every request id at the end
// (indexRequests), once it knows how many there are.
func (f *FSM) place(l *lease) {
	f.byResource.ReplaceOrInsert(entry{l})
	l.holder.add(l)
	f.countSlot(l, 1)
	f.countIdentity(l, 1)
}

func (f *FSM) remove(l *lease) {
	f.byResource.Delete(entry{l})
	f.countSlot(l, -1)
	f.countIdentity(l, -1)
	l.holder.remove(l)
	f.unindexRequest(l)
	f.rememberEnd(l)
	if len(l.holder.leases) == 0 {
		delete(f.holders, l.holder.name)
	}
}
