package fsm

import (
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
//
// The check applies to entries whose proposer set check_request_params (every proposer of this version);
// older entries replay as they did, so an old log applies to the same state.

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

// indexRequest records a new live lease's key. Logs of earlier versions may hold two live leases under one
// key (different resources); the first keeps the key.
func (f *FSM) indexRequest(l *lease) {
	if l.requestID != "" {
		f.byRequest.add(keyOf(l), l)
	}
}

func (f *FSM) unindexRequest(l *lease) {
	if l.requestID != "" {
		f.byRequest.remove(keyOf(l), l)
	}
}

// requestIndex maps dedup keys to live leases. It is keyed by a 64-bit hash of the key rather than by the
// key's three strings: 16 bytes a slot instead of 56, for a million leases granted under request ids. The
// lease holds the key itself, so a lookup checks it; a key whose hash another live key already took goes
// to the overflow map, keyed in full. What a lookup answers depends only on which leases hold which keys,
// never on hashes, so every node agrees; keys made to collide on purpose cost what every key cost before.
type requestIndex struct {
	byHash   map[uint64]*lease
	overflow map[requestKey]*lease
	hash     func(requestKey) uint64 // fnvHash; tests make every key collide
}

func newRequestIndex() requestIndex {
	return requestIndex{byHash: make(map[uint64]*lease), overflow: make(map[requestKey]*lease), hash: fnvHash}
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
func (x requestIndex) get(k requestKey) (*lease, bool) {
	h := x.hash(k)
	if l, ok := x.byHash[h]; ok && keyOf(l) == k {
		return l, true
	}
	l, ok := x.overflow[k]
	return l, ok
}

// add makes l the holder of k unless a live lease already holds it.
func (x requestIndex) add(k requestKey, l *lease) {
	if _, taken := x.get(k); taken {
		return
	}
	if h := x.hash(k); x.byHash[h] == nil {
		x.byHash[h] = l
	} else {
		x.overflow[k] = l
	}
}

// remove forgets k if l holds it.
func (x requestIndex) remove(k requestKey, l *lease) {
	if h := x.hash(k); x.byHash[h] == l {
		delete(x.byHash, h)
	} else if x.overflow[k] == l {
		delete(x.overflow, k)
	}
}

// replace makes now hold k where was held it (writable's copy of a lease).
func (x requestIndex) replace(k requestKey, was, now *lease) {
	if h := x.hash(k); x.byHash[h] == was {
		x.byHash[h] = now
	} else if x.overflow[k] == was {
		x.overflow[k] = now
	}
}

// sameRequest answers an Acquire whose dedup key names a live grant: replayed if its parameters match,
// refused otherwise. ok is false when the key names no live grant (or the entry predates the check).
func (f *FSM) sameRequest(c *wirepb.AcquireCmd) (Result, bool) {
	// Semaphore slots are newer than the check: every slot request is checked, whoever proposed it.
	if (!c.GetCheckRequestParams() && c.GetLimit() == 0) || c.GetRequestId() == "" {
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
