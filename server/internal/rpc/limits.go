package rpc

import (
	"time"

	"github.com/leased/leased/server/internal/errs"
)

// Limits on what clients hold (decision 14: bounded everything). Each is checked at the edge, before
// anything is queued, subscribed or proposed, and a refusal is a limitError: ResourceExhausted with a
// google.rpc.QuotaFailure whose subject is the flag that sets the limit, so an operator reading the
// client's error knows what to raise. Where each is enforced:
//
//	--max-watchers, --max-watchers-per-conn        watch.Hub.Subscribe, LeasesService.Watch (internal/watch, conns.go)
//	--max-waiters, --max-waiters-per-resource      waitq.Queue.Enqueue (internal/waitq)
//	--max-streams-per-conn                         connLimiter's interceptors (conns.go)
//	--max-leases, --quota-bytes                    leases.State.AdmitGrant (internal/leases)
//	--max-connections, --max-connection-idle       ConnGate, the client port's options (connlimit.go)
//	--max-*-per-identity                           see identitylimits.go

// ErrLimit is the sentinel of every limit refusal (limitError).
var ErrLimit = errs.ErrLimit

// limitError is a refusal by one of the limits above; it maps to ResourceExhausted.
type limitError = errs.Limit

// limited builds a limitError for flag.
func limited(flag, format string, args ...any) error { return errs.Limited(flag, format, args...) }

// Limits are enforced at the edge, before anything is proposed (server.Limits; docs/design.md, "Limits",
// documents the defaults).
type Limits struct {
	MaxResourceBytes  int
	MaxHolderBytes    int
	MaxValueBytes     int
	MaxRequestIDBytes int
	// MinTTL and MaxTTL bound the TTL an Acquire may ask for. MinTTL 0 means the server's
	// Config.TTLFloor; a MinTTL below the floor is a configuration error.
	MinTTL, MaxTTL     time.Duration
	MaxLockDelay       time.Duration
	MaxLeasesPerHolder int // with client authentication, per holder label within one identity
	// MaxRequestBytes is the largest gRPC message a client may send.
	MaxRequestBytes int
	// MaxKeepAliveLeases is the most leases one KeepAlive message may renew.
	MaxKeepAliveLeases int
	// MaxListLimit is the largest List page.
	MaxListLimit int

	// Bounds on what clients hold on a node (decision 14; limits.go, docs/design.md "Limits"). Each
	// refusal is ResourceExhausted naming its flag.
	//
	// MaxWatchers is the most Watch streams a node serves, MaxWatchersPerConn the most one client
	// connection holds. MaxWaiters is the most blocking acquires the leader queues, and
	// MaxWaitersPerResource the most for one resource. MaxStreamsPerConn is the most concurrent RPCs
	// (streams and unary calls) on one client connection.
	MaxWatchers           int
	MaxWatchersPerConn    int
	MaxWaiters            int
	MaxWaitersPerResource int
	MaxStreamsPerConn     int
	// MaxLeases is the most live leases in the cluster: past it, grants of free resources are refused
	// (the per-holder limit alone is bypassed by inventing holder names).
	MaxLeases int

	// With client authentication, what one identity may hold, so that it cannot starve the others
	// (identitylimits.go): live leases in the cluster (decided by the state machine, like the per-holder
	// limit), Watch streams on a node, blocking acquires queued on the leader. 0 means a quarter of
	// MaxLeases, MaxWatchers and MaxWaiters respectively. Without client authentication they do not apply.
	MaxLeasesPerIdentity   int
	MaxWatchersPerIdentity int
	MaxWaitersPerIdentity  int
	// QuotaBytesPerIdentity is the state size one identity's leases may reach (internal/leases/quota.go; checked by the
	// leader like QuotaBytes, not by the state machine); 0 means a quarter of QuotaBytes.
	QuotaBytesPerIdentity int64

	// MaxConnections is the most connections the client and HTTP ports hold together (connlimit.go);
	// one more is accepted and closed at once. 0 means sized to the descriptor limit
	// (DefaultMaxConnections). The admin and peer ports do not count, so health checks and raft go on
	// at the limit.
	MaxConnections int
	// MaxConnectionIdle closes a client or HTTP connection that has had no call open for this long, and
	// one that has not finished its TLS and HTTP/2 handshake within the same time (at most
	// HandshakeTimeout), so idle connections do not hold the slots of MaxConnections.
	MaxConnectionIdle time.Duration
	// QuotaBytes is the state size (internal/leases/quota.go: live leases and lock-delays, in bytes) at or past which
	// grants of free resources are refused, while renewals, releases and reads go on (etcd's NOSPACE).
	QuotaBytes int64

	// minTTLWhy explains MinTTL in the InvalidArgument answer to a shorter TTL (ExplainMinTTL).
	minTTLWhy string
}

// ExplainMinTTL is l with why as the reason an Acquire below MinTTL is told (the server resolves MinTTL
// from the election timeout and explains it).
func ExplainMinTTL(l Limits, why string) Limits {
	l.minTTLWhy = why
	return l
}
