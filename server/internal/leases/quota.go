package leases

import (
	"sync"
	"sync/atomic"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server/internal/errs"
)

// The data-size quota (--quota-bytes) and the lease count limit (--max-leases), etcd's NOSPACE semantics:
// past either, grants of free resources are refused at the edge, while renewals, releases, expiries and
// reads go on, so the state can only shrink until it is back under; releasing or raising the limit
// clears the condition (docs/operations.md, "Quota").
//
// The size is the state's, not the raft log file's: bbolt never gives back the pages it grew to, so a
// file-size quota could only be cleared by an offline compaction, while the state shrinks the moment a
// lease ends. Every node counts it the same way from the results of the entries it applies (and from
// the state machine after a snapshot restore), so at the same applied index every node reports the same
// size; the limit is checked by the leader, before proposing, and never by the state machine. It is a
// soft bound: grants proposed while the count is still under the limit may take it past by as much as they
// hold, as etcd's quota can be passed by the writes in flight when it is reached.

// leaseOverheadBytes is what the state keeps per lease beyond its names and value (the B-tree entry, the
// lease record, the holder index: fsm's memory benchmark measures about 190 bytes per small lease), and
// lockDelayOverheadBytes the same for a lock-delay.
const (
	leaseOverheadBytes     = 128
	lockDelayOverheadBytes = 64
)

// leaseBytes is what one live lease counts against the quota.
func leaseBytes(l *fsm.Lease) int64 {
	return leaseOverheadBytes + int64(len(l.Resource)+len(l.Holder)+len(l.Value)+len(l.RequestID))
}

// stateSize is the node's count of live leases and state bytes, updated by the apply loop and read by
// the edge and the metrics without a lock; and, with client authentication, the bytes of each identity's
// leases (--quota-bytes-per-identity; lock-delays belong to no identity).
type stateSize struct {
	leases atomic.Int64
	bytes  atomic.Int64

	mu         sync.Mutex
	byIdentity map[string]int64
}

// identityBytes is what identity's live leases count against the quota.
func (s *stateSize) identityBytes(identity string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byIdentity[identity]
}

// addIdentity adds delta bytes to identity's count (nothing without an identity).
func (s *stateSize) addIdentity(identity string, delta int64) {
	if identity == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byIdentity == nil {
		s.byIdentity = make(map[string]int64)
	}
	if n := s.byIdentity[identity] + delta; n > 0 {
		s.byIdentity[identity] = n
	} else {
		delete(s.byIdentity, identity)
	}
}

// applied follows one applied entry's result: grants add, releases and expiries subtract, and so do the
// lock-delays it started and ended.
func (s *stateSize) applied(res fsm.Result) {
	var leases, bytes int64
	for i := range res.Events {
		e := &res.Events[i]
		if e.Type == leasepb.EventType_EVENT_TYPE_GRANTED {
			leases, bytes = leases+1, bytes+leaseBytes(&e.Lease)
			s.addIdentity(e.Lease.Identity, leaseBytes(&e.Lease))
		} else {
			leases, bytes = leases-1, bytes-leaseBytes(&e.Lease)
			s.addIdentity(e.Lease.Identity, -leaseBytes(&e.Lease))
		}
	}
	for _, d := range res.Changes.DelaysStarted {
		bytes += lockDelayOverheadBytes + int64(len(d.Resource))
	}
	for _, d := range res.Changes.DelaysEnded {
		bytes -= lockDelayOverheadBytes + int64(len(d.Resource))
	}
	if leases != 0 {
		s.leases.Add(leases)
	}
	if bytes != 0 {
		s.bytes.Add(bytes)
	}
}

// reset counts a whole state machine (at start, after a snapshot restore).
func (s *stateSize) reset(sm *fsm.FSM) {
	var leases, bytes int64
	byIdentity := make(map[string]int64)
	sm.Ascend(func(l fsm.Lease) bool {
		leases, bytes = leases+1, bytes+leaseBytes(&l)
		if l.Identity != "" {
			byIdentity[l.Identity] += leaseBytes(&l)
		}
		return true
	})
	s.mu.Lock()
	s.byIdentity = byIdentity
	s.mu.Unlock()
	for _, d := range sm.LockDelays() {
		bytes += lockDelayOverheadBytes + int64(len(d.Resource))
	}
	s.leases.Store(leases)
	s.bytes.Store(bytes)
}

// UsedBytes is the state size counted against --quota-bytes.
func (s *State) UsedBytes() int64 { return s.size.bytes.Load() }

// QuotaFull reports whether the state is at or past --quota-bytes: the NOSPACE alarm of /readyz and
// leased_quota_exceeded.
func (s *State) QuotaFull() bool { return s.size.bytes.Load() >= s.cfg.Limits.QuotaBytes }

// Held reports whether an acquire of resource could only be answered "held" in this node's state: a
// live plain lease, or every slot of its semaphore taken (fsm.Full).
func (s *State) Held(resource string) (held bool) {
	s.Read(func(sm *fsm.FSM) { held = sm.Full(resource) })
	return held
}

// AdmitGrant refuses an acquire that would grant a free resource while the state is at or past
// --quota-bytes or holds --max-leases leases, or while identity's leases are at or past
// --quota-bytes-per-identity. An acquire of a held resource passes: the state machine answers it "held"
// or, for a retry of the same intent, with the grant it already made (decision 5), and neither grows the
// state.
func (s *State) AdmitGrant(resource, identity string) error {
	lim := s.cfg.Limits
	bytes, leases := s.size.bytes.Load(), s.size.leases.Load()
	var own int64
	if identity != "" {
		own = s.size.identityBytes(identity)
	}
	if bytes < lim.QuotaBytes && leases < int64(lim.MaxLeases) && own < lim.QuotaBytesPerIdentity {
		return nil
	}
	switch {
	case s.Held(resource):
		return nil
	case own >= lim.QuotaBytesPerIdentity:
		return errs.Limited("--quota-bytes-per-identity", "identity %q's leases hold %d bytes of state, at its quota of %d: new grants to it "+
			"are refused until it releases some or the quota is raised", identity, own, lim.QuotaBytesPerIdentity)
	case bytes >= lim.QuotaBytes:
		return errs.Limited("--quota-bytes", "the state holds %d bytes, at its quota of %d: new grants are refused "+
			"until leases are released or the quota is raised (renewals, releases and reads go on)", bytes, lim.QuotaBytes)
	default:
		return errs.Limited("--max-leases", "%d leases are live, the most the cluster may hold: new grants are refused "+
			"until leases are released or the limit is raised", leases)
	}
}
