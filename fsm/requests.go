package fsm

import (
	"math/bits"
	"strconv"

	"github.com/leased/leased/api/wirepb"
)

// Request ids (decision 5, scoped as decision 10 requires). A live lease granted under a request id is
// indexed by its dedup key: (identity, request id) when the grant has an authenticated identity, else
// (holder, request id) as before identities existed. An Acquire whose key names a live grant is the same
// intent retried: it gets that grant back (replayed) if it repeats the grant's parameters, and is refused
// (RequestReused) if it does not, so a request id cannot silently stand for two different requests.
//
// Not part of the fingerprint: wait. It says how to obtain the grant, not what the grant is, and the SDK
// asks for one intent first without waiting and then waiting, under one request id: a grant made by either
// attempt must answer the other (docs/design.md, "Request ids").

// requestKey is a dedup key. holder is empty when identity is set: the holder is then only a label, and
// a retry that changes it is a different request (RequestReused on "holder").
type requestKey struct {
	identity, holder, id string
}

func keyOf(l *lease) requestKey {
	if l.identity != "" {
		return requestKey{identity: l.identity, id: l.requestID}
	}
	return requestKey{holder: l.holder.name, id: l.requestID}
}

func keyOfCmd(c *wirepb.AcquireCmd) requestKey {
	if c.GetIdentity() != "" {
		return requestKey{identity: c.GetIdentity(), id: c.GetRequestId()}
	}
	return requestKey{holder: c.GetHolder(), id: c.GetRequestId()}
}

// indexRequest records a new live lease's key. Only the first live lease under a key holds it (two
// cannot be made: sameRequest answers the second with the first).
func (f *FSM) indexRequest(l *lease) {
	if l.requestID != "" {
		f.byRequest.add(keyOf(l), l)
	}
}

// indexRequests indexes the n request ids of the leases a restore placed: sized for them first, the
// index is built without resizes (which rehash every key about twice on the way to a million).
func (f *FSM) indexRequests(n int) {
	if n == 0 {
		return
	}
	f.byRequest.reserve(n)
	f.byResource.Ascend(func(e entry) bool {
		f.indexRequest(e.lease)
		return true
	})
}

func (f *FSM) unindexRequest(l *lease) {
	if l.requestID != "" {
		f.byRequest.remove(keyOf(l), l)
	}
}

// requestIndex maps dedup keys to live leases: an open-addressing hash table (linear probing) of lease
// pointers, 8 bytes a bucket, at most five eighths of them used so that a key not indexed (a fresh
// Acquire's) is found absent within about four probes. A Go map of 64-bit hashes cost 34-38 bytes a
// lease at a million.
//
// The lease holds the key itself, so a lookup compares keys, never only hashes: what it answers depends
// on which leases hold which keys, so every node agrees. The hash is fixed (no seed, as the FSM must be),
// so a client could choose request ids that crowd one run of buckets; a key that finds no free bucket
// within maxProbe of its home goes to the overflow map instead, keyed in full (and seeded by the
// runtime), and keys made to collide on purpose cost what every key cost before. The index is split into
// requestTables tables, each resized on its own, so no resize rehashes more than a few thousand keys.
type requestIndex struct {
	tables   [requestTables]leaseTable
	overflow map[requestKey]*lease
	hash     func(requestKey) uint64 // fnvHash; tests make every key collide
}

// leaseTable is one table of the index: its length is a power of two, 1<<(64-shift), or 0 before its
// first lease.
type leaseTable struct {
	buckets []*lease
	shift   uint8
	live    int
}

const (
	requestTables = 256 // chosen by the spread hash's top byte
	maxProbe      = 32  // buckets a key may sit past its home before it goes to the overflow map
	minBuckets    = 8   // a table's smallest size
)

func newRequestIndex() requestIndex {
	return requestIndex{overflow: make(map[requestKey]*lease), hash: fnvHash}
}

// fnvHash is FNV-1a over the key's strings, each followed by a 0 byte (fixed, as the FSM must be: no
// random seed).
func fnvHash(k requestKey) uint64 {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for _, s := range [3]string{k.identity, k.holder, k.id} {
		for i := 0; i < len(s); i++ {
			h = (h ^ uint64(s[i])) * prime
		}
		h *= prime // the separator: h ^ 0 is h
	}
	return h
}

// get returns the live lease holding key k.
func (x *requestIndex) get(k requestKey) (*lease, bool) { return x.getHashed(k, x.spread(k)) }

// getHashed is get with k's spread hash h computed once by the caller.
func (x *requestIndex) getHashed(k requestKey, h uint64) (*lease, bool) {
	tab, home := x.placeOf(h)
	mask := len(tab.buckets) - 1
	for i, b := 0, home; i < maxProbe && len(tab.buckets) > 0; i, b = i+1, (b+1)&mask {
		l := tab.buckets[b]
		if l == nil {
			break
		}
		if keyOf(l) == k {
			return l, true
		}
	}
	if len(x.overflow) == 0 {
		return nil, false
	}
	l, ok := x.overflow[k]
	return l, ok
}

// add makes l the holder of k unless a live lease already holds it.
func (x *requestIndex) add(k requestKey, l *lease) {
	h := x.spread(k) // hashed once: it is every Acquire's with a request id
	if _, taken := x.getHashed(k, h); taken {
		return
	}
	tab, _ := x.placeOf(h)
	if (tab.live+1)*8 > len(tab.buckets)*5 {
		x.resize(tab, max(minBuckets, 2*len(tab.buckets)))
	}
	if !x.insert(tab, h, l) {
		x.overflow[k] = l
	}
}

// reserve sizes every table for its share of n keys as adding them one by one would leave it (at most
// 5/8 full), with a margin for tables that get more than their share: a quarter, and 16 for the
// variance of small shares. A table that gets more still resizes on its own.
func (x *requestIndex) reserve(n int) {
	share := n/requestTables + n/(4*requestTables) + 16
	size := minBuckets
	for size*5 < share*8 {
		size *= 2
	}
	for i := range x.tables {
		if tab := &x.tables[i]; len(tab.buckets) < size {
			x.resize(tab, size)
		}
	}
}

// remove forgets k if l holds it.
func (x *requestIndex) remove(k requestKey, l *lease) {
	if tab, b, ok := x.bucketOf(k, l); ok {
		x.unlink(tab, b)
		tab.live--
		if len(tab.buckets) > minBuckets && tab.live*8 < len(tab.buckets) {
			x.resize(tab, len(tab.buckets)/2)
		}
	} else if x.overflow[k] == l {
		delete(x.overflow, k)
	}
}

// replace makes now hold k where was held it (writable's copy of a lease).
func (x *requestIndex) replace(k requestKey, was, now *lease) {
	if tab, b, ok := x.bucketOf(k, was); ok {
		tab.buckets[b] = now
	} else if x.overflow[k] == was {
		x.overflow[k] = now
	}
}

// spread is k's hash spread by a multiplication (by 2^64 over the golden ratio) so that its top byte and
// the bits below choose a table and a bucket well.
func (x *requestIndex) spread(k requestKey) uint64 { return x.hash(k) * 0x9e3779b97f4a7c15 }

// placeOf returns the table of a key with spread hash h and its home bucket there.
func (x *requestIndex) placeOf(h uint64) (*leaseTable, int) {
	tab := &x.tables[h>>56]
	if len(tab.buckets) == 0 {
		return tab, 0
	}
	return tab, int((h << 8) >> tab.shift)
}

// bucketOf finds the bucket where l is indexed under k.
func (x *requestIndex) bucketOf(k requestKey, l *lease) (*leaseTable, int, bool) {
	tab, home := x.placeOf(x.spread(k))
	mask := len(tab.buckets) - 1
	for i, b := 0, home; i < maxProbe && len(tab.buckets) > 0; i, b = i+1, (b+1)&mask {
		switch tab.buckets[b] {
		case nil:
			return nil, 0, false
		case l:
			return tab, b, true
		}
	}
	return nil, 0, false
}

// insert puts l, whose key has spread hash h, in the first empty bucket within maxProbe of its home in
// tab; false if there is none.
func (x *requestIndex) insert(tab *leaseTable, h uint64, l *lease) bool {
	_, home := x.placeOf(h)
	mask := len(tab.buckets) - 1
	for i, b := 0, home; i < maxProbe; i, b = i+1, (b+1)&mask {
		if tab.buckets[b] == nil {
			tab.buckets[b] = l
			tab.live++
			return true
		}
	}
	return false
}

// unlink empties bucket b and moves back the later leases of its run that would no longer be found past
// the hole (deletion without tombstones). A lease moved back only comes nearer its home.
func (x *requestIndex) unlink(tab *leaseTable, b int) {
	mask := len(tab.buckets) - 1
	for hole, next := b, (b+1)&mask; ; next = (next + 1) & mask {
		l := tab.buckets[next]
		if l == nil {
			tab.buckets[hole] = nil
			return
		}
		// The lease at next may fill the hole unless its home lies cyclically in (hole, next].
		if _, home := x.placeOf(x.spread(keyOf(l))); (next-home)&mask >= (next-hole)&mask {
			tab.buckets[hole] = l
			hole = next
		}
	}
}

// resize rebuilds tab with n buckets (a power of two); a lease that no longer fits within maxProbe of
// its home goes to the overflow map.
func (x *requestIndex) resize(tab *leaseTable, n int) {
	old := tab.buckets
	tab.buckets, tab.live = make([]*lease, n), 0
	tab.shift = uint8(64 - bits.TrailingZeros(uint(n)))
	for _, l := range old {
		if l != nil && !x.insert(tab, x.spread(keyOf(l)), l) {
			x.overflow[keyOf(l)] = l
		}
	}
}

// sameRequest answers an Acquire whose dedup key names a live grant: replayed if its parameters match,
// refused otherwise. ok is false when the key names no live grant.
func (f *FSM) sameRequest(c *wirepb.AcquireCmd) (Result, bool) {
	if c.GetRequestId() == "" {
		return Result{}, false
	}
	l, ok := f.byRequest.get(keyOfCmd(c))
	if !ok {
		return Result{}, false
	}
	if r, differs := paramsDiffer(l, c); differs {
		r.RequestID = c.GetRequestId()
		return Result{Code: RequestReused, Reuse: r, Lease: l.export()}, true
	}
	return Result{Code: OK, Lease: l.export(), Replayed: true}, true
}

// paramsDiffer names the first parameter of c that is not the grant's, in the order of AcquireRequest.
func paramsDiffer(l *lease, c *wirepb.AcquireCmd) (Reuse, bool) {
	switch {
	case l.resource != c.GetResource():
		return Reuse{Field: "resource", Was: strconv.Quote(l.resource), Now: strconv.Quote(c.GetResource())}, true
	case l.identity != "" && l.holder.name != c.GetHolder():
		return Reuse{Field: "holder", Was: strconv.Quote(l.holder.name), Now: strconv.Quote(c.GetHolder())}, true
	case l.ttlMs != durationMs(c.GetTtlMs()):
		return Reuse{Field: "ttl_ms", Was: strconv.FormatInt(int64(l.ttlMs), 10), Now: strconv.FormatInt(c.GetTtlMs(), 10)}, true
	case !l.has(flagProclaimed) && l.value != string(c.GetValue()):
		return Reuse{Field: "value", Was: strconv.Itoa(len(l.value)) + " bytes", Now: strconv.Itoa(len(c.GetValue())) + " other bytes"}, true
	case l.lockDelayMs != durationMs(c.GetLockDelayMs()):
		return Reuse{Field: "lock_delay_ms", Was: strconv.FormatInt(int64(l.lockDelayMs), 10), Now: strconv.FormatInt(c.GetLockDelayMs(), 10)}, true
	case l.limit != c.GetLimit():
		return Reuse{Field: "limit", Was: strconv.FormatUint(uint64(l.limit), 10), Now: strconv.FormatUint(uint64(c.GetLimit()), 10)}, true
	}
	return Reuse{}, false
}
