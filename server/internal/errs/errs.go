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
)

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
