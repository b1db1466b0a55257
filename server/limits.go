package server

import "github.com/leased/leased/server/internal/errs"

// Limits on what clients hold (decision 14: bounded everything). Each is checked at the edge, before
// anything is queued, subscribed or proposed, and a refusal is a limitError: ResourceExhausted with a
// google.rpc.QuotaFailure whose subject is the flag that sets the limit, so an operator reading the
// client's error knows what to raise. Where each is enforced:
//
//	--max-watchers, --max-watchers-per-conn        watch.Hub.Subscribe, leasesService.Watch (internal/watch, conns.go)
//	--max-waiters, --max-waiters-per-resource      waitq.Queue.Enqueue (internal/waitq)
//	--max-streams-per-conn                         connLimiter's interceptors (conns.go)
//	--max-leases, --quota-bytes                    leases.State.AdmitGrant (internal/leases)
//	--max-connections, --max-connection-idle       connGate, the client port's options (connlimit.go)
//	--max-*-per-identity                           see identitylimits.go

// ErrLimit is the sentinel of every limit refusal (limitError).
var ErrLimit = errs.ErrLimit

// limitError is a refusal by one of the limits above; it maps to ResourceExhausted.
type limitError = errs.Limit

// limited builds a limitError for flag.
func limited(flag, format string, args ...any) error { return errs.Limited(flag, format, args...) }
