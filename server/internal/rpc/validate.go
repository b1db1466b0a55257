package rpc

import (
	"strconv"
	"strings"
	"time"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/fsm"
)

// Request validation at the edge: every limit is checked before anything is proposed, and a bad request
// changes nothing. The limits are documented in api/proto/leased/v1/leases.proto and docs/design.md ("Limits").

func (l Limits) resource(field, r string) error {
	switch {
	case r == "":
		return invalid(field, "must not be empty")
	case len(r) > l.MaxResourceBytes:
		return invalid(field, "is %d bytes, the limit is %d", len(r), l.MaxResourceBytes)
	case strings.HasPrefix(r, "/") || strings.HasSuffix(r, "/") || strings.Contains(r, "//"):
		return invalid(field, "%q must not start or end with '/' or contain '//'", r)
	}
	for i := 0; i < len(r); i++ {
		if !resourceByte(r[i]) {
			return invalid(field, "%q has a character outside [A-Za-z0-9] and \"/_-.:@=+\" at byte %d", r, i)
		}
	}
	return nil
}

// resourceByte reports whether a resource name may hold c: [A-Za-z0-9] and "/_-.:@=+". A table, since
// every KeepAlive checks each byte of up to MaxKeepAliveLeases names.
func resourceByte(c byte) bool { return resourceBytes[c] }

var resourceBytes = func() (ok [256]bool) {
	for _, r := range [][2]byte{{'a', 'z'}, {'A', 'Z'}, {'0', '9'}} {
		for c := r[0]; c <= r[1]; c++ {
			ok[c] = true
		}
	}
	for _, c := range []byte("/_-.:@=+") {
		ok[c] = true
	}
	return ok
}()

// prefix validates a List/Watch prefix: like a resource, but may be empty or end with '/'.
func (l Limits) prefix(field, p string) error {
	if p == "" {
		return nil
	}
	return l.resource(field, strings.TrimSuffix(p, "/"))
}

// printable checks a holder or request id: printable ASCII without spaces.
func printable(field, s string, maxBytes int, required bool) error {
	switch {
	case s == "" && required:
		return invalid(field, "must not be empty")
	case len(s) > maxBytes:
		return invalid(field, "is %d bytes, the limit is %d", len(s), maxBytes)
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return invalid(field, "has a non-printable or space character at byte %d", i)
		}
	}
	return nil
}

func token(field string, t uint64) error {
	if t == 0 {
		return invalid(field, "must be a fencing token (> 0)")
	}
	return nil
}

// MaxWait bounds AcquireRequest.wait_ms: a year and a day, far beyond any wait a caller means, and far
// inside what a Duration holds.
const MaxWait = 366 * 24 * time.Hour

func (l Limits) acquire(r *leasepb.AcquireRequest) error {
	if err := l.resource("resource", r.GetResource()); err != nil {
		return err
	}
	if err := printable("holder", r.GetHolder(), l.MaxHolderBytes, true); err != nil {
		return err
	}
	if err := printable("request_id", r.GetRequestId(), l.MaxRequestIDBytes, false); err != nil {
		return err
	}
	if r.GetAttempt() > 0 && r.GetRequestId() == "" {
		return invalid("attempt", "numbers the attempts of one request id; it requires request_id")
	}
	// Compared in milliseconds, never converted to a Duration first: 2^58 ms in nanoseconds overflows
	// int64 and wraps to a value inside the range.
	switch ttl := r.GetTtlMs(); {
	case ttl <= 0 || ttl < ceilMs(l.MinTTL):
		return outOfBound("ttl_ms", ttl, l.MinTTL.Milliseconds(), false, l.minTTLWhy)
	case ttl > l.MaxTTL.Milliseconds():
		return outOfBound("ttl_ms", ttl, l.MaxTTL.Milliseconds(), true, "")
	}
	if len(r.GetValue()) > l.MaxValueBytes {
		return invalid("value", "is %d bytes, the limit is %d", len(r.GetValue()), l.MaxValueBytes)
	}
	switch d := r.GetLockDelayMs(); {
	case d < 0:
		return outOfBound("lock_delay_ms", d, 0, false, "")
	case d > l.MaxLockDelay.Milliseconds():
		return outOfBound("lock_delay_ms", d, l.MaxLockDelay.Milliseconds(), true, "")
	}
	switch w := r.GetWaitMs(); {
	case w < 0:
		return outOfBound("wait_ms", w, 0, false, "")
	case w > MaxWait.Milliseconds():
		return outOfBound("wait_ms", w, MaxWait.Milliseconds(), true, "")
	case w > 0 && !r.GetWait():
		return invalid("wait_ms", "ends a wait; it requires wait")
	}
	switch {
	case r.GetLimit() > fsm.MaxSemaphoreLimit:
		return invalid("limit", "%d is above the most slots a semaphore may have, %d", r.GetLimit(), fsm.MaxSemaphoreLimit)
	case r.GetLimit() > 0 && r.GetLockDelayMs() != 0:
		return invalid("lock_delay_ms", "a semaphore slot (limit %d) takes no lock-delay", r.GetLimit())
	}
	return nil
}

func (l Limits) proclaim(r *leasepb.ProclaimRequest) error {
	if err := l.leaseRef(r.GetResource(), r.GetToken()); err != nil {
		return err
	}
	if len(r.GetValue()) > l.MaxValueBytes {
		return invalid("value", "is %d bytes, the limit is %d", len(r.GetValue()), l.MaxValueBytes)
	}
	return nil
}

// ceilMs is d in whole milliseconds, rounded up: a TTL of n ms is at least d exactly when n >= ceilMs(d).
func ceilMs(d time.Duration) int64 {
	ms := d.Milliseconds()
	if time.Duration(ms)*time.Millisecond < d {
		ms++
	}
	return ms
}

func (l Limits) leaseRef(resource string, tok uint64) error {
	if err := l.resource("resource", resource); err != nil {
		return err
	}
	return token("token", tok)
}

func (l Limits) keepAlive(r *leasepb.KeepAliveRequest) error {
	if n := len(r.GetLeases()); n > l.MaxKeepAliveLeases {
		return invalid("leases", "renews %d leases, the limit is %d", n, l.MaxKeepAliveLeases)
	}
	for _, ref := range r.GetLeases() {
		if err := l.leaseRef(ref.GetResource(), ref.GetToken()); err != nil {
			return err
		}
	}
	return nil
}

// write validates a client write (Acquire, Renew, Release or KeepAlive), in the form it travels in when
// forwarded. A write is validated on the node a client sent it to and again on the leader it was forwarded
// to: the leader proposes it, and must not trust a follower to have checked.
func (l Limits) write(req *wirepb.ForwardRequest) error {
	switch r := req.GetRequest().(type) {
	case *wirepb.ForwardRequest_Acquire:
		return l.acquire(r.Acquire)
	case *wirepb.ForwardRequest_Renew:
		return l.leaseRef(r.Renew.GetResource(), r.Renew.GetToken())
	case *wirepb.ForwardRequest_Release:
		return l.leaseRef(r.Release.GetResource(), r.Release.GetToken())
	case *wirepb.ForwardRequest_KeepAlive:
		return l.keepAlive(r.KeepAlive)
	case *wirepb.ForwardRequest_Proclaim:
		return l.proclaim(r.Proclaim)
	default:
		return invalid("request", "not a write this node knows")
	}
}

func (l Limits) list(r *leasepb.ListRequest) error {
	if err := l.prefix("prefix", r.GetPrefix()); err != nil {
		return err
	}
	if err := printable("holder", r.GetHolder(), l.MaxHolderBytes, false); err != nil {
		return err
	}
	if r.GetLimit() > uint32(l.MaxListLimit) {
		return invalid("limit", "%d is above the page limit %d", r.GetLimit(), l.MaxListLimit)
	}
	if pt := r.GetPageToken(); pt != "" {
		resource, _, err := parsePageToken(pt)
		if err != nil {
			return err
		}
		return l.resource("page_token", resource)
	}
	return nil
}

// A List page token names the last lease of the previous page: its resource, and for a semaphore slot
// "#" and its token ('#' is not a resource character, so the two parts cannot be confused).

func pageToken(l fsm.Lease) string {
	if l.Limit > 0 {
		return l.Resource + "#" + strconv.FormatUint(l.Token, 10)
	}
	return l.Resource
}

func parsePageToken(pt string) (string, uint64, error) {
	resource, slot, found := strings.Cut(pt, "#")
	if !found {
		return resource, 0, nil
	}
	tok, err := strconv.ParseUint(slot, 10, 64)
	if err != nil || tok == 0 {
		return "", 0, invalid("page_token", "%q is not a token this server issued", pt)
	}
	return resource, tok, nil
}

func (l Limits) watch(r *leasepb.WatchRequest) error {
	if r.GetResource() != "" && r.GetPrefix() != "" {
		return invalid("prefix", "give either resource or prefix, not both")
	}
	if r.GetResource() != "" {
		return l.resource("resource", r.GetResource())
	}
	return l.prefix("prefix", r.GetPrefix())
}

// Validate checks a client request against l as the edge does: an Acquire, KeepAlive, List or Watch, or
// a write in the form it is forwarded in. The services call the checks themselves; Validate is for
// checking a configuration's limits from outside the package (the server's tests of its Config).
func Validate(l Limits, req any) error {
	switch r := req.(type) {
	case *leasepb.AcquireRequest:
		return l.acquire(r)
	case *leasepb.KeepAliveRequest:
		return l.keepAlive(r)
	case *leasepb.ListRequest:
		return l.list(r)
	case *leasepb.WatchRequest:
		return l.watch(r)
	case *wirepb.ForwardRequest:
		return l.write(r)
	}
	return invalid("request", "not a request the edge checks (%T)", req)
}
