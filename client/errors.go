package client

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
)

// Sentinel errors. Every error the client returns for a server answer wraps one of these, so callers can
// use errors.Is.
var (
	// ErrHeld: the resource is held by someone else (or is in its lock-delay). See *HeldError.
	ErrHeld = errors.New("leased: resource held")
	// ErrNotFound: no lease on the resource, or the token is no longer its current grant.
	ErrNotFound = errors.New("leased: not found")
	// ErrInvalid: the request broke a documented limit; nothing changed.
	ErrInvalid = errors.New("leased: invalid argument")
	// ErrUnavailable: no leader could be reached within the call's deadline and retry budget.
	ErrUnavailable = errors.New("leased: cluster unavailable")
	// ErrLimit: a per-holder or per-node limit was reached.
	ErrLimit = errors.New("leased: limit reached")
	// ErrCompacted: a Watch asked for events older than the server keeps. See *CompactedError.
	ErrCompacted = errors.New("leased: watch history compacted")
	// ErrUnsupported: the server does not implement the call yet (gRPC Unimplemented), e.g. the Cluster
	// service's membership and snapshot calls.
	ErrUnsupported = errors.New("leased: the server does not support this yet")
	// ErrPrecondition: the Cluster service refused a request whose precondition failed (e.g. promoting a
	// learner that has not caught up).
	ErrPrecondition = errors.New("leased: precondition failed")
	// ErrUnauthenticated: the cluster did not accept this client's credentials: a TLS handshake failure
	// (a server certificate from an unknown CA, a client certificate missing, expired or refused), or
	// gRPC Unauthenticated. The message names the TLS problem. Not retried: the same credentials fail
	// the same way.
	ErrUnauthenticated = errors.New("leased: not authenticated")
	// ErrPermissionDenied: the cluster knows this client's identity and refuses it the call (gRPC
	// PermissionDenied; the message names the identity and the missing permission).
	ErrPermissionDenied = errors.New("leased: permission denied")
	// ErrClosed: the client was closed.
	ErrClosed = errors.New("leased: client closed")
	// ErrOutcomeUnknown: a write (Acquire, Renew, Release) may or may not have taken effect. An attempt
	// reached the cluster and went unanswered (the leader lost its leadership or stopped before the entry
	// applied, the call timed out, a connection broke mid-call), and no later attempt learned what
	// happened. It wraps the error of that unanswered attempt (so errors.Is ErrUnavailable or
	// context.DeadlineExceeded holds as well), never a NotFound. Retrying the same write is safe.
	ErrOutcomeUnknown = errors.New("leased: outcome unknown")

	// Why a Lease ended (Lease.Err).

	// ErrReleased: Release was called.
	ErrReleased = errors.New("leased: lease released")
	// ErrExpired: the cluster says the lease is gone (expired, or released elsewhere).
	ErrExpired = errors.New("leased: lease expired")
	// ErrLostContact: no renewal succeeded in time; the lease may still exist on the cluster, but it can no
	// longer be trusted.
	ErrLostContact = errors.New("leased: lost contact with the cluster")
	// ErrTooLate: Fenced refused to start because too little of the lease remained.
	ErrTooLate = errors.New("leased: too little of the lease remains")
)

// HeldError says who holds a resource.
type HeldError struct {
	Resource string
	Holder   string
	// Identity is the authenticated identity holding the lease ("" without client certificates).
	Identity string
	Token    uint64
	// Remaining is the leader's view of the time left on the lease (or on the lock-delay).
	RemainingMs int64
	LockDelayed bool
	// Limit is set when the resource is a semaphore with all of its Limit slots held; Holder, Token
	// and RemainingMs then describe its oldest slot.
	Limit int
}

func (e *HeldError) Error() string {
	if e.LockDelayed {
		return fmt.Sprintf("leased: %q is in its lock-delay (%d ms left)", e.Resource, e.RemainingMs)
	}
	if e.Limit > 0 {
		return fmt.Sprintf("leased: all %d slots of %q are held (the oldest by %q, token %d, %d ms left)", e.Limit, e.Resource, e.Holder, e.Token, e.RemainingMs)
	}
	return fmt.Sprintf("leased: %q is held by %q (token %d, %d ms left)", e.Resource, e.Holder, e.Token, e.RemainingMs)
}

// Is makes errors.Is(err, ErrHeld) true.
func (e *HeldError) Is(target error) bool { return target == ErrHeld }

// AccessError is ErrUnauthenticated (Identity empty) or ErrPermissionDenied, with what the server named:
// the caller's identity, the permission it lacks (read, lease or admin), the resource or prefix ("" for
// the whole cluster), and the identity holding the lease when the call named another's.
type AccessError struct {
	Identity, Permission, Resource, Owner string
	msg                                   string
}

func (e *AccessError) Error() string { return e.msg }

// Is makes errors.Is(err, ErrUnauthenticated) or errors.Is(err, ErrPermissionDenied) true.
func (e *AccessError) Is(target error) bool {
	if e.Identity == "" {
		return target == ErrUnauthenticated
	}
	return target == ErrPermissionDenied
}

func accessErrorOf(st *status.Status) error {
	e := &AccessError{msg: st.Message()}
	for _, d := range st.Details() {
		if a, ok := d.(*leasepb.AccessDenied); ok {
			e.Identity, e.Resource, e.Owner = a.GetIdentity(), a.GetResource(), a.GetOwner()
			e.Permission = permissionName(a.GetPermission())
		}
	}
	if st.Code() == codes.PermissionDenied && e.Identity == "" {
		e.Identity = "?" // a server without details: still a denial, not an authentication failure
	}
	return e
}

func permissionName(p leasepb.Permission) string {
	switch p {
	case leasepb.Permission_PERMISSION_READ:
		return "read"
	case leasepb.Permission_PERMISSION_LEASE:
		return "lease"
	case leasepb.Permission_PERMISSION_ADMIN:
		return "admin"
	}
	return ""
}

// waitEndedError is a waiting Acquire whose context ended while the cluster still said "held". It is
// the held answer (errors.Is ErrHeld, errors.As *HeldError), and says that the wait ended.
type waitEndedError struct {
	held  *HeldError
	cause error
}

func (e *waitEndedError) Error() string {
	return fmt.Sprintf("%v; gave up waiting (%v)", e.held, e.cause)
}

// Unwrap gives the held answer only: a wait that ran out is "still held", not a timeout.
func (e *waitEndedError) Unwrap() error { return e.held }

// outcomeUnknownError is ErrOutcomeUnknown. cause is the last attempt whose outcome was unknown; final is
// the call's last answer, which did not settle it.
type outcomeUnknownError struct {
	op           string
	cause, final error
}

func (e *outcomeUnknownError) Error() string {
	msg := fmt.Sprintf("leased: outcome unknown: the %s may or may not have taken effect (retrying is safe): ", e.op)
	cause, final := e.cause.Error(), ""
	if e.final != nil {
		final = e.final.Error()
	}
	switch {
	case final == "" || final == cause:
		return msg + cause
	case strings.Contains(final, cause): // the final answer names the attempt already: say it once
		return msg + final
	}
	return msg + cause + "; then: " + final
}

// Is makes errors.Is(err, ErrOutcomeUnknown) true.
func (e *outcomeUnknownError) Is(target error) bool { return target == ErrOutcomeUnknown }

// Unwrap gives the error of the last attempt whose outcome was unknown (ErrUnavailable, or a
// context.DeadlineExceeded).
func (e *outcomeUnknownError) Unwrap() error { return e.cause }

// OutcomeRequestID gives the request id of the Acquire call whose outcome err leaves open (err wraps
// ErrOutcomeUnknown): the id the caller gave, or the one the SDK drew for the call. A grant that call may
// have made holds the resource until its TTL runs out; an Acquire WithRequestID(id) (same resource,
// holder and options) returns that grant if it still exists, to use or release, and otherwise asks anew.
// ok is false for any other error.
func OutcomeRequestID(err error) (id string, ok bool) {
	var e *acquireOutcomeError
	if !errors.As(err, &e) {
		return "", false
	}
	return e.requestID, true
}

// acquireOutcomeError is an Acquire's error that wraps ErrOutcomeUnknown, with the call's request id: no
// attempt learned whether the grant happened, or it happened and the renewal Acquire makes after a long
// wait went unanswered (the SDK then does not hold the grant, which expires after its TTL).
type acquireOutcomeError struct {
	requestID string
	err       error
}

func (e *acquireOutcomeError) Error() string {
	return fmt.Sprintf("%v (request id %s)", e.err, e.requestID)
}

func (e *acquireOutcomeError) Unwrap() error { return e.err }

// withAcquireOutcome names requestID on an Acquire's error that leaves the outcome open.
func withAcquireOutcome(err error, requestID string) error {
	if errors.Is(err, ErrOutcomeUnknown) {
		return &acquireOutcomeError{requestID: requestID, err: err}
	}
	return err
}

// InvalidError is ErrInvalid with what the server named: the request field, and, for a number outside a
// bound, the bound (in the field's units: milliseconds for ttl_ms and lock_delay_ms) and why it is what it
// is. leasectl uses it to phrase a limit in its flag's units.
type InvalidError struct {
	// Field is the request field ("ttl_ms"); "" when the server named none.
	Field string
	// Bounded: the value broke a bound. Value and Limit are in the field's units; Above says the value is
	// above the maximum Limit, else below the minimum.
	Bounded      bool
	Value, Limit int64
	Above        bool
	// Why explains the bound ("the TTL must outlast a leader failover: ..."); often empty.
	Why string
	msg string
}

func (e *InvalidError) Error() string { return e.msg }

// Is makes errors.Is(err, ErrInvalid) true.
func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

func invalidErrorOf(st *status.Status) error {
	e := &InvalidError{msg: withMessage(ErrInvalid, st.Message()).Error()}
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.BadRequest:
			if v := d.GetFieldViolations(); len(v) > 0 && e.Field == "" {
				e.Field = v[0].GetField()
			}
		case *errdetails.ErrorInfo:
			if d.GetDomain() != "leased" || (d.GetReason() != "BELOW_MINIMUM" && d.GetReason() != "ABOVE_MAXIMUM") {
				continue
			}
			md := d.GetMetadata()
			value, verr := strconv.ParseInt(md["value"], 10, 64)
			limit, lerr := strconv.ParseInt(md["limit"], 10, 64)
			if verr == nil && lerr == nil {
				e.Field, e.Bounded, e.Value, e.Limit = md["field"], true, value, limit
				e.Above, e.Why = d.GetReason() == "ABOVE_MAXIMUM", md["why"]
			}
		}
	}
	return e
}

// EndedError is Release's ErrNotFound with what the cluster remembers of how the lease ended: the
// release did not take effect, unless Forgotten.
type EndedError struct {
	Resource string
	Token    uint64
	// Expired: the lease expired (at log index Index) before this release.
	Expired bool
	Index   uint64
	// Forgotten: the token is older than the lease ends the cluster remembers, so it cannot say whether
	// the lease was released or expired. Neither set: the token never was a grant of the resource.
	Forgotten bool
	msg       string
}

func (e *EndedError) Error() string { return fmt.Sprintf("%v: %s", ErrNotFound, e.msg) }

// Is makes errors.Is(err, ErrNotFound) true.
func (e *EndedError) Is(target error) bool { return target == ErrNotFound }

// CompactedError names the oldest index a Watch can start from.
type CompactedError struct{ OldestIndex uint64 }

func (e *CompactedError) Error() string {
	return fmt.Sprintf("leased: events before index %d are no longer retained", e.OldestIndex)
}

// Is makes errors.Is(err, ErrCompacted) true.
func (e *CompactedError) Is(target error) bool { return target == ErrCompacted }

// FromStatus maps an error of the raw gRPC API (api/leasepb, called on a connection of the caller's own)
// to this package's errors, as the Client's calls return them: errors.Is(err, ErrUnavailable) and the
// other sentinels hold, a held resource is a *HeldError, an ended lease an *EndedError, a refused
// argument an *InvalidError. Tools that drive the API directly (client/loadgen's batched keep-alive load)
// use it so that their failures read and map like the SDK's. An error that is not a gRPC status, and
// nil, are returned unchanged.
func FromStatus(err error) error { return fromStatus(err) }

// fromStatus maps a gRPC error to the client's errors, keeping the server's message.
func fromStatus(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	msg := st.Message()
	switch st.Code() {
	case codes.FailedPrecondition:
		for _, d := range st.Details() {
			if h, ok := d.(*leasepb.LeaseHeld); ok {
				return &HeldError{Resource: h.GetResource(), Holder: h.GetHolder(), Identity: h.GetIdentity(), Token: h.GetToken(),
					RemainingMs: h.GetRemainingMs(), LockDelayed: h.GetLockDelayed(), Limit: int(h.GetLimit())}
			}
		}
		return withMessage(ErrHeld, msg)
	case codes.NotFound:
		for _, d := range st.Details() {
			if e, ok := d.(*leasepb.LeaseEnded); ok {
				return &EndedError{Resource: e.GetResource(), Token: e.GetToken(), Index: e.GetIndex(),
					Expired: e.GetHow() == leasepb.EventType_EVENT_TYPE_EXPIRED, Forgotten: e.GetForgotten(), msg: msg}
			}
		}
		return withMessage(ErrNotFound, msg)
	case codes.InvalidArgument:
		return invalidErrorOf(st)
	case codes.ResourceExhausted:
		return withMessage(ErrLimit, msg)
	case codes.OutOfRange:
		for _, d := range st.Details() {
			if w, ok := d.(*leasepb.WatchCompacted); ok {
				return &CompactedError{OldestIndex: w.GetOldestIndex()}
			}
		}
		return withMessage(ErrCompacted, msg)
	case codes.Unavailable:
		return withMessage(ErrUnavailable, msg)
	case codes.DeadlineExceeded:
		return withMessage(context.DeadlineExceeded, msg)
	case codes.Canceled:
		return withMessage(context.Canceled, msg)
	case codes.Aborted:
		if se, ok := supersededErrorOf(st); ok {
			return se
		}
	case codes.Unimplemented:
		return fmt.Errorf("%w (Unimplemented: %s)", ErrUnsupported, msg)
	case codes.Unauthenticated, codes.PermissionDenied:
		return accessErrorOf(st)
	}
	return err
}

// withMessage wraps sentinel with the server's message, unless the message only repeats the sentinel
// (gRPC's own DeadlineExceeded says "context deadline exceeded"): no phrase is said twice.
func withMessage(sentinel error, msg string) error {
	s := sentinel.Error()
	msg = strings.TrimPrefix(msg, s+": ")
	if msg == "" || msg == s || msg == strings.TrimPrefix(s, "leased: ") {
		return fmt.Errorf("%w", sentinel)
	}
	return fmt.Errorf("%w: %s", sentinel, msg)
}

// retryable reports whether a call may be retried elsewhere: the cluster had no leader, the node was
// unreachable or shutting down, or the server gave up waiting for the entry to apply. Writes are retried
// only because they are idempotent (Acquire carries its request id; Renew names a token; a Release of a
// token already released answers OK), and callWrite reports ErrOutcomeUnknown when no retry settles an
// attempt whose outcome was unknown.
func retryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable:
		return true
	case codes.DeadlineExceeded:
		// The server's own proposal timeout (the caller's deadline is checked separately): the outcome is
		// unknown, and the retry is safe for the same reasons.
		return true
	}
	return false
}

// leaderHint extracts the leader's address from an Unavailable status, if the server knew it.
func leaderHint(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return ""
	}
	for _, d := range st.Details() {
		if h, ok := d.(*leasepb.LeaderHint); ok {
			return h.GetLeaderAddr()
		}
	}
	return ""
}

// isLimit reports whether err is a server limit's refusal: ResourceExhausted with a QuotaFailure, whose
// subject names the flag that sets the limit.
func isLimit(err error) bool {
	for _, d := range status.Convert(err).Details() {
		if _, ok := d.(*errdetails.QuotaFailure); ok {
			return true
		}
	}
	return false
}
