package rpc

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server/internal/auth"
	"github.com/leased/leased/server/internal/errs"
)

// Sentinel errors of the request path (package server exports them under the same names). Code wraps
// them with %w; ToStatus maps them to gRPC codes with errors.Is, so wrapped errors still map.
var (
	ErrHeld          = errors.New("resource held")
	ErrLockDelayed   = errors.New("resource in lock-delay")
	ErrNotFound      = errors.New("no lease on resource")
	ErrHolderLimit   = errors.New("holder lease limit reached")
	ErrUnimplemented = errors.New("not implemented yet")
)

// The node's own sentinels (internal/errs, internal/auth), under the names the request path uses.
var (
	ErrNotLeader         = errs.ErrNotLeader
	ErrNoLeader          = errs.ErrNoLeader
	ErrStopped           = errs.ErrStopped
	ErrTimeout           = errs.ErrTimeout
	ErrInvalid           = errs.ErrInvalid
	ErrNotCurrent        = errs.ErrNotCurrent
	ErrCompacted         = errs.ErrCompacted
	ErrRemoved           = errs.ErrRemoved
	ErrMemberNotFound    = errs.ErrMemberNotFound
	ErrMemberExists      = errs.ErrMemberExists
	ErrMembershipRefused = errs.ErrMembershipRefused
	ErrOutcomeUnknown    = errs.ErrOutcomeUnknown
	ErrUnauthenticated   = auth.ErrUnauthenticated
	ErrPermissionDenied  = auth.ErrPermissionDenied
)

// fieldError is an invalid request field (errs.Field): InvalidArgument with a google.rpc.BadRequest, and
// for a number outside a bound a google.rpc.ErrorInfo naming the bound (boundDetail).
type fieldError = errs.Field

// ErrorInfoDomain and the reasons of the ErrorInfo a bound travels in (docs/api.md, "Errors").
const (
	ErrorInfoDomain    = "leased"
	ReasonBelowMinimum = "BELOW_MINIMUM"
	ReasonAboveMaximum = "ABOVE_MAXIMUM"
)

func boundDetail(field string, b *errs.Bound) *errdetails.ErrorInfo {
	reason := ReasonBelowMinimum
	if b.Above {
		reason = ReasonAboveMaximum
	}
	md := map[string]string{"field": field, "value": fmt.Sprint(b.Value), "limit": fmt.Sprint(b.Limit)}
	if b.Why != "" {
		md["why"] = b.Why
	}
	return &errdetails.ErrorInfo{Reason: reason, Domain: ErrorInfoDomain, Metadata: md}
}

// outOfBound is an invalid field whose value broke a bound: below limit, or above it.
func outOfBound(field string, value, limit int64, above bool, why string) error {
	reason := fmt.Sprintf("%d is below the minimum %d", value, limit)
	if above {
		reason = fmt.Sprintf("%d is above the maximum %d", value, limit)
	}
	if why != "" {
		reason += " (" + why + ")"
	}
	return &fieldError{Field: field, Reason: reason, Bound: &errs.Bound{Value: value, Limit: limit, Above: above, Why: why}}
}

var invalid = errs.Invalid

// heldError carries the current grant for FailedPrecondition details.
type heldError struct {
	detail *leasepb.LeaseHeld
}

func (e *heldError) Error() string {
	if e.detail.LockDelayed {
		return fmt.Sprintf("resource %q is in its lock-delay for %dms", e.detail.Resource, e.detail.RemainingMs)
	}
	if e.detail.Limit > 0 {
		return fmt.Sprintf("all %d slots of semaphore %q are held; the oldest by %q with token %d", e.detail.Limit, e.detail.Resource, e.detail.Holder, e.detail.Token)
	}
	return fmt.Sprintf("resource %q is held by %q with token %d", e.detail.Resource, e.detail.Holder, e.detail.Token)
}

func (e *heldError) Is(target error) bool {
	return target == ErrHeld || (e.detail.LockDelayed && target == ErrLockDelayed)
}

// endedError is a Release whose token is not current, with what the FSM remembers of the lease's end;
// it maps to NotFound with a LeaseEnded.
type endedError struct{ end fsm.End }

func (e *endedError) Error() string {
	switch e.end.How {
	case fsm.EndExpired:
		return fmt.Sprintf("%v: token %d of %q expired (at index %d), so no release ended it", ErrNotCurrent, e.end.Token, e.end.Resource, e.end.Index)
	case fsm.EndForgotten:
		return fmt.Sprintf("%v: token %d of %q is older than the lease ends this cluster remembers (released or expired)", ErrNotCurrent, e.end.Token, e.end.Resource)
	}
	return ErrNotCurrent.Error()
}

func (e *endedError) Is(target error) bool { return target == ErrNotCurrent }

func (e *endedError) detail() *leasepb.LeaseEnded {
	d := &leasepb.LeaseEnded{Resource: e.end.Resource, Token: e.end.Token, Forgotten: e.end.How == fsm.EndForgotten}
	if e.end.How == fsm.EndExpired {
		d.How, d.Index = leasepb.EventType_EVENT_TYPE_EXPIRED, e.end.Index
	}
	return d
}

// compactedError carries the oldest index a Watch can start from.
type compactedError = errs.Compacted

// Hint is what the node knows of the leader, attached to Unavailable answers: its id and client address.
type Hint struct {
	ID   uint64
	Addr string
}

// ToStatus turns an error into a gRPC status with details a program can act on, hint in its LeaderHint.
func ToStatus(err error, hint Hint) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	var (
		fe *fieldError
		he *heldError
		ce *compactedError
		ee *endedError
		ae *auth.AccessError
		le *limitError
		se *supersededError
	)
	switch {
	case errors.As(err, &fe):
		details := []protoadapt.MessageV1{&errdetails.BadRequest{
			FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: fe.Field, Description: fe.Reason}}}}
		if fe.Bound != nil {
			details = append(details, boundDetail(fe.Field, fe.Bound))
		}
		return withDetails(codes.InvalidArgument, err, details...)
	case errors.As(err, &he):
		return withDetails(codes.FailedPrecondition, err, he.detail)
	case errors.As(err, &se):
		return withDetails(codes.Aborted, err, se.detail())
	case errors.As(err, &ce):
		return withDetails(codes.OutOfRange, err, &leasepb.WatchCompacted{OldestIndex: ce.Oldest})
	case errors.As(err, &ee):
		return withDetails(codes.NotFound, err, ee.detail())
	case errors.As(err, &ae) && errors.Is(err, ErrUnauthenticated):
		return withDetails(codes.Unauthenticated, err, ae.Detail)
	case errors.As(err, &ae):
		return withDetails(codes.PermissionDenied, err, ae.Detail)
	case errors.Is(err, ErrNotCurrent), errors.Is(err, ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.As(err, &le):
		return withDetails(codes.ResourceExhausted, err, &errdetails.QuotaFailure{
			Violations: []*errdetails.QuotaFailure_Violation{{Subject: le.Flag, Description: le.Msg}}})
	case errors.Is(err, ErrHolderLimit):
		return withDetails(codes.ResourceExhausted, err, &errdetails.QuotaFailure{
			Violations: []*errdetails.QuotaFailure_Violation{{Subject: "--max-leases-per-holder", Description: err.Error()}}})
	case errors.Is(err, ErrNotLeader), errors.Is(err, ErrNoLeader), errors.Is(err, ErrStopped):
		return withDetails(codes.Unavailable, err, &leasepb.LeaderHint{LeaderId: hint.ID, LeaderAddr: hint.Addr,
			OutcomeUnknown: errors.Is(err, ErrOutcomeUnknown)})
	case errors.Is(err, ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, ErrMemberNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, ErrMemberExists):
		return status.Error(codes.AlreadyExists, err.Error())
	case errors.Is(err, ErrMembershipRefused), errors.Is(err, ErrRemoved):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, ErrUnimplemented):
		return status.Error(codes.Unimplemented, err.Error())
	default:
		return status.Error(codes.Internal, err.Error())
	}
}

func withDetails(code codes.Code, err error, details ...protoadapt.MessageV1) error {
	st := status.New(code, err.Error())
	if d, derr := st.WithDetails(details...); derr == nil {
		st = d
	}
	return st.Err()
}
