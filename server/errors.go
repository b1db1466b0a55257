package server

import (
	"errors"

	"github.com/leased/leased/server/internal/auth"
	"github.com/leased/leased/server/internal/errs"
	"github.com/leased/leased/server/internal/rpc"
)

// Sentinel errors. Code inside the server wraps them with %w; the request path (internal/rpc, ToStatus)
// maps them to gRPC codes with errors.Is, so wrapped errors still map.
var (
	ErrNotLeader     = errs.ErrNotLeader
	ErrNoLeader      = errs.ErrNoLeader
	ErrStopped       = errs.ErrStopped
	ErrTimeout       = errs.ErrTimeout
	ErrInvalid       = errs.ErrInvalid
	ErrHeld          = rpc.ErrHeld
	ErrLockDelayed   = rpc.ErrLockDelayed
	ErrNotCurrent    = errs.ErrNotCurrent
	ErrNotFound      = rpc.ErrNotFound
	ErrHolderLimit   = rpc.ErrHolderLimit
	ErrCompacted     = errs.ErrCompacted
	ErrUnimplemented = rpc.ErrUnimplemented
	// ErrRemoved is the fatal error of a node that was removed from the cluster: it stops serving, and its
	// data dir refuses to start again (New).
	ErrRemoved = errs.ErrRemoved
	// ErrMemberNotFound: no member has the given id (or name).
	ErrMemberNotFound = errs.ErrMemberNotFound
	// ErrMemberExists: a member with the given name, id or address is already in the cluster.
	ErrMemberExists = errs.ErrMemberExists
	// ErrMembershipRefused: the membership change is not possible now (a learner not caught up, the last
	// voter, a change already in progress, a quorum the change would lose, ...).
	ErrMembershipRefused = errs.ErrMembershipRefused
	// ErrOutcomeUnknown marks a write that was proposed (or handed to the leader) but whose entry this node
	// cannot see apply: the write may or may not take effect. It travels with ErrNotLeader, ErrNoLeader or
	// ErrStopped (an Unavailable answer) and sets LeaderHint.outcome_unknown.
	ErrOutcomeUnknown = errs.ErrOutcomeUnknown
	// ErrDiskStalled is the fatal error of a node whose raft log write did not return within
	// Config.DiskStallTimeout (decision 13: fail-stop beats limping).
	ErrDiskStalled = errs.ErrDiskStalled
	// ErrLoopStalled: the node's raft loop has not run for an election timeout (a blocked disk write, a
	// starved process); Server.Ready reports it, and the node is not ready until the loop runs again.
	ErrLoopStalled = errors.New("raft loop stalled")
	// ErrUnauthenticated: the node requires a client certificate identity and the request had none.
	ErrUnauthenticated = auth.ErrUnauthenticated
	// ErrPermissionDenied: the identity lacks a permission the call needs.
	ErrPermissionDenied = auth.ErrPermissionDenied
)

// ErrLimit is the sentinel of every limit refusal (decision 14): ResourceExhausted with a
// google.rpc.QuotaFailure whose subject is the flag that sets the limit.
var ErrLimit = errs.ErrLimit
