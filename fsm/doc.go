// Package fsm is leased's lease state machine: the only arbiter of who holds what.
//
// # Basics
//
// Every node applies the same committed Raft log entries, in order, to its own FSM. Each entry carries one
// wirepb.Command; Apply(index, command) changes the state and returns a Result, including the watch events
// the entry caused. A grant's fencing token is the index of the entry that granted it, so tokens are unique
// and strictly increasing in grant order.
//
// The commands are:
//
//   - Acquire grants a free resource (token = index). The same holder retrying with the same request id gets
//     the existing grant back unchanged; anyone else gets a Held result naming the current grant.
//     A numbered attempt (AcquireCmd.attempt) of a request id that was already refused at that attempt or
//     a later one, or whose grant ended, is Superseded and changes nothing: the FSM remembers the last
//     MaxRememberedRequests such request ids (attempts.go).
//   - Release ends a lease, but only if the token given is the resource's current grant. A Release of a token
//     that an earlier Release ended (a retry whose answer was lost) answers OK, replayed: the FSM remembers
//     the last MaxRememberedEnds lease ends (released or expired, and at which index), so a retry learns
//     what its first attempt did, identically on every node.
//   - Expire ends each listed lease whose token is still current; stale or duplicate expirations are no-ops.
//     A lease acquired with a lock-delay leaves its resource in a delayed (ungrantable) state until an
//     EndLockDelay command for that expiry.
//   - Acquire with a limit N > 0 grants one slot of the resource's counting semaphore of N slots: each slot
//     is a lease of its own with its own token, at most N are live, and every live slot of a resource has
//     the same N (semaphore.go).
//   - Proclaim replaces the value of a current lease (or slot), keeping its token.
//   - Checkpoint records, per lease, the leader's remaining TTL (a duration) and whether the lease was renewed
//     since the previous checkpoint. Renew marks a lease renewed durably (the first renewal of an idle lease).
//
// # Promises
//
// The FSM is pure and deterministic: it reads no clock, draws no random number, does no I/O, starts no
// goroutine and never logs. The same entries in give the same state out, and equal states give byte-identical
// snapshots (records are kept sorted, and protobuf marshalling is deterministic). A snapshot is versioned
// and checksummed; Restore rejects garbage or truncated input with an error and never returns a half state.
//
// # Caveats
//
// An FSM is not safe for concurrent use: the server serialises Apply with reads (the apply goroutine owns it,
// or a lock guards it). The exception is a View (view.go): taken like a write, it freezes the state in O(1)
// and may then be encoded as a snapshot on another goroutine while the FSM goes on applying. Results and
// Lease values returned to callers are copies, except Value slices, which the caller must not modify.
package fsm
