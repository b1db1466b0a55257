package fsm

import (
	"bytes"
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
	if l.requestID == "" {
		return
	}
	k := keyOf(l)
	if _, taken := f.byRequest[k]; !taken {
		f.byRequest[k] = l
	}
}

func (f *FSM) unindexRequest(l *lease) {
	if l.requestID == "" {
		return
	}
	if k := keyOf(l); f.byRequest[k] == l {
		delete(f.byRequest, k)
	}
}

// sameRequest answers an Acquire whose dedup key names a live grant: replayed if its parameters match,
// refused otherwise. ok is false when the key names no live grant (or the entry predates the check).
func (f *FSM) sameRequest(c *wirepb.AcquireCmd) (Result, bool) {
	// Semaphore slots are newer than the check: every slot request is checked, whoever proposed it.
	if (!c.GetCheckRequestParams() && c.GetLimit() == 0) || c.GetRequestId() == "" {
		return Result{}, false
	}
	l, ok := f.byRequest[keyOfCmd(c)]
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
	case l.ttlMs != c.GetTtlMs():
		return Reuse{Field: "ttl_ms", Was: strconv.FormatInt(l.ttlMs, 10), Now: strconv.FormatInt(c.GetTtlMs(), 10)}, true
	case !l.has(flagProclaimed) && !bytes.Equal(l.value, c.GetValue()):
		return Reuse{Field: "value", Was: strconv.Itoa(len(l.value)) + " bytes", Now: strconv.Itoa(len(c.GetValue())) + " other bytes"}, true
	case l.lockDelayMs != c.GetLockDelayMs():
		return Reuse{Field: "lock_delay_ms", Was: strconv.FormatInt(l.lockDelayMs, 10), Now: strconv.FormatInt(c.GetLockDelayMs(), 10)}, true
	case l.limit != c.GetLimit():
		return Reuse{Field: "limit", Was: strconv.FormatUint(uint64(l.limit), 10), Now: strconv.FormatUint(uint64(c.GetLimit()), 10)}, true
	}
	return Reuse{}, false
}
