// Package errs holds the errors that the node's internal packages and the offline restore return and
// package server maps to gRPC statuses: the sentinels package server exports (it re-declares them, so a
// caller's errors.Is works whichever package returned the error), and the typed refusals that carry a
// status's details. It sits below every other package of the node and imports nothing of ours.
package errs

import (
	"errors"
	"fmt"
)

// Sentinels that package server exports under the same names.
var (
	ErrNotLeader  = errors.New("not the leader")
	ErrNotCurrent = errors.New("token is not the current grant")
	ErrStopped    = errors.New("server stopped")
	ErrCompacted  = errors.New("watch history compacted")
	ErrInvalid    = errors.New("invalid argument")
	// ErrLimit is the sentinel of every limit refusal (Limit).
	ErrLimit = errors.New("limit reached")
	// ErrDiskStalled is the fatal error of a node whose raft log write did not return within the disk
	// stall timeout.
	ErrDiskStalled = errors.New("raft log write stalled")
	ErrNoLeader    = errors.New("no leader")
	ErrTimeout     = errors.New("timed out")
	// ErrRemoved is the fatal error of a node that was removed from the cluster.
	ErrRemoved = errors.New("this node was removed from the cluster")
	// ErrMemberNotFound: no member has the given id (or name).
	ErrMemberNotFound = errors.New("no such member")
	// ErrMemberExists: a member with the given name, id or address is already in the cluster.
	ErrMemberExists = errors.New("member already exists")
	// ErrMembershipRefused: the membership change is not possible now.
	ErrMembershipRefused = errors.New("membership change refused")
	// ErrOutcomeUnknown marks a write that was proposed (or handed to the leader) but whose entry this node
	// cannot see apply (UnknownOutcome).
	ErrOutcomeUnknown = errors.New("outcome unknown")
)

// UnknownOutcome marks err as the answer to a write that may still take effect (ErrOutcomeUnknown).
func UnknownOutcome(err error) error {
	if err == nil || errors.Is(err, ErrOutcomeUnknown) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
}

// Field is an invalid request field; it maps to InvalidArgument with a google.rpc.BadRequest, and, for a
// number outside a bound, a google.rpc.ErrorInfo naming the Bound, so that a client can phrase the limit
// in its own units.
type Field struct {
	Field, Reason string
	Bound         *Bound // nil unless a number broke a bound
}

// Bound is the bound a field's value broke, in the field's units (milliseconds for *_ms).
type Bound struct {
	Value, Limit int64
	Above        bool   // the value is above the maximum limit (else below the minimum)
	Why          string // why the bound is what it is ("" when it is simply the documented limit)
}

func (e *Field) Error() string        { return fmt.Sprintf("%s: %s", e.Field, e.Reason) }
func (e *Field) Is(target error) bool { return target == ErrInvalid }

// Invalid builds a Field refusal of field.
func Invalid(field, format string, args ...any) error {
	return &Field{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Limit is a refusal by one of the limits on what clients hold (decision 14: bounded everything); it maps
// to ResourceExhausted with a google.rpc.QuotaFailure whose subject is Flag, so an operator reading the
// client's error knows what to raise.
type Limit struct {
	Flag string // the flag that sets the limit, e.g. "--max-watchers"
	Msg  string
}

func (e *Limit) Error() string        { return fmt.Sprintf("%s (%s)", e.Msg, e.Flag) }
func (e *Limit) Is(target error) bool { return target == ErrLimit }

// Limited builds a Limit refusal for flag.
func Limited(flag, format string, args ...any) error {
	return &Limit{Flag: flag, Msg: fmt.Sprintf(format, args...)}
}

// Compacted carries the oldest index a Watch can start from; it maps to OutOfRange with a
// leasepb.WatchCompacted.
type Compacted struct{ Oldest uint64 }

func (e *Compacted) Error() string {
	return fmt.Sprintf("events before index %d are no longer retained", e.Oldest)
}
func (e *Compacted) Is(target error) bool { return target == ErrCompacted }
