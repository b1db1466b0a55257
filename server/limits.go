package server

import (
	"errors"
	"fmt"
)

// Limits on what clients hold (decision 14: bounded everything). Each is checked at the edge, before
// anything is queued, subscribed or proposed, and a refusal is a limitError: ResourceExhausted with a
// google.rpc.QuotaFailure whose subject is the flag that sets the limit, so an operator reading the
// client's error knows what to raise. Where each is enforced:
//
//	--max-watchers, --max-watchers-per-conn        watchHub.subscribe, leasesService.Watch (watch.go, conns.go)
//	--max-waiters, --max-waiters-per-resource      waitQueue.enqueue (waitqueue.go)
//	--max-streams-per-conn                         connLimiter's interceptors (conns.go)
//	--max-leases, --quota-bytes                    node.admitGrant (quota.go)
//	--max-connections, --max-connection-idle       connGate, the client port's options (connlimit.go)
//	--max-*-per-identity                           see identitylimits.go

// ErrLimit is the sentinel of every limit refusal (limitError).
var ErrLimit = errors.New("limit reached")

// limitError is a refusal by one of the limits above; it maps to ResourceExhausted.
type limitError struct {
	flag string // the flag that sets the limit, e.g. "--max-watchers"
	msg  string
}

func (e *limitError) Error() string        { return fmt.Sprintf("%s (%s)", e.msg, e.flag) }
func (e *limitError) Is(target error) bool { return target == ErrLimit }

// limited builds a limitError for flag.
func limited(flag, format string, args ...any) error {
	return &limitError{flag: flag, msg: fmt.Sprintf(format, args...)}
}
