package fsm

import "github.com/leased/leased/api/leasepb"

// Code is the outcome of applying one command.
type Code uint8

const (
	// OK: the command took effect (or, for Expire / Checkpoint / EndLockDelay, was applied to every listed
	// lease that was still current; the others were ignored).
	OK Code = iota
	// Held: Acquire found the resource granted to someone else (or to the same holder under another
	// request id). Result.Lease is the current grant.
	Held
	// LockDelayed: Acquire found the resource in its lock-delay. Result.Delay describes it.
	LockDelayed
	// NotCurrent: Release (or Proclaim) named a token that is not the resource's current grant, and not one that a
	// Release ended (that answers OK, Replayed). Result.End says whether it expired, never was a grant, or
	// is too old to be remembered.
	NotCurrent
	// HolderLimit: Acquire would exceed the command's holder_limit.
	HolderLimit
	// Invalid: the command was malformed (empty names, a non-positive TTL). Nothing changed. The server
	// validates requests before proposing them, so this only guards against a faulty proposer.
	Invalid
	// Denied: the command's identity lacks a permission (the ACL's lease on Acquire; lease, or admin for
	// another identity's lease, on Release). Result.Denial says which. Nothing changed.
	Denied
	// RequestReused: Acquire named a request id that the same identity (or, without one, holder) holds a
	// grant under, with other parameters. Result.Reuse names the first that differs; Result.Lease is
	// that grant. Nothing changed.
	RequestReused
	// LimitMismatch: Acquire asked for a semaphore slot (or a plain lease) of a resource whose live
	// grants have another limit: a semaphore of other size, or a plain lease (limit 0) where slots are
	// held, or a slot where a plain lease is. Result.Lease is a current grant (its Limit is the
	// resource's). Nothing changed.
	LimitMismatch
	// Superseded: Acquire was a stale attempt of its request id (attempts.go): a later attempt was
	// already answered with a refusal, or the request id's grant already ended. Result.Stale says which.
	// Nothing changed.
	Superseded
	// IdentityLimit: Acquire would exceed the command's identity_limit: its identity holds that many
	// leases. Nothing changed.
	IdentityLimit
)

var codeNames = [...]string{"ok", "held", "lock-delayed", "not-current", "holder-limit", "invalid", "denied", "request-reused", "limit-mismatch", "superseded", "identity-limit"}

// String names the code in lowercase.
func (c Code) String() string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	return "unknown"
}

// Result is what applying one command produced: the answer to its proposer (Code, Lease, Replayed, Delay)
// and everything it changed (Events and Changes). The server's listeners (the lessor, blocking acquires,
// watchers, metrics) learn of an entry only from its Result: whether a token was current when the entry
// applied is decided here, once, and never again by a listener.
type Result struct {
	Code Code
	// Lease is the grant for a successful Acquire (new or replayed), the current grant for Held (for a
	// full semaphore, its oldest slot) and LimitMismatch, the released lease for Release (zero for a
	// replayed Release), and the lease with its new value for Proclaim.
	Lease Lease
	// Replayed is true when Acquire returned an existing grant made under the same request id, or when
	// Release named a token that an earlier Release had already ended (a retry whose answer was lost).
	Replayed bool
	// End is set for a Release whose token was no longer current: how the lease ended (EndReleased for a
	// replayed Release, with the index of the entry that released it; EndExpired, EndNone or
	// EndForgotten for NotCurrent).
	End End
	// Delay is set for LockDelayed.
	Delay LockDelay
	// Denial is set for Denied.
	Denial Denial
	// Reuse is set for RequestReused.
	Reuse Reuse
	// Stale is set for Superseded.
	Stale StaleAttempt
	// Handoff is, for a ReleaseHandoff entry, the result of the Acquire it carried, as an Acquire entry
	// of its own would have produced it (its Events are also in Events, after the release's); the Code,
	// Lease, Replayed and End above answer the release. Nil for every other command.
	Handoff *Result
	// Events are the grants, releases and expiries this command made, in order; each carries the entry's
	// index. Watchers see exactly these.
	Events []Event
	// Changes is what else the command changed.
	Changes Changes
}

// Changes are the changes of one command besides grants, releases and expiries (Result.Events). Each
// names a lease or lock-delay that was current when it changed; a command's stale references are not
// listed. Lists are in the command's order.
type Changes struct {
	// Renewed are the leases a Renew entry marked renewed: their renewal is durable.
	Renewed []Ref
	// Checkpointed are the leases a Checkpoint entry recorded.
	Checkpointed []Checkpoint
	// DelaysStarted are the lock-delays begun by the expiry of a lease that asked for one.
	DelaysStarted []LockDelay
	// DelaysEnded are the lock-delays an EndLockDelay entry ended.
	DelaysEnded []Ref
	// ACLSet is true when a SetAcl entry replaced the rules.
	ACLSet bool
}

// Denial says which permission a command's identity lacked, on which resource.
type Denial struct {
	Identity   string
	Permission leasepb.Permission
	Resource   string
	// Owner is the identity holding the lease when the command named another identity's lease.
	Owner string
}

// Reuse names the first parameter in which an Acquire differs from the grant its request id made: Field
// is the AcquireRequest field ("resource", "ttl_ms", "value", "lock_delay_ms", "holder"), Was and Now
// describe the two values.
type Reuse struct {
	RequestID, Field, Was, Now string
}

// StaleAttempt describes a Superseded Acquire: its request id and attempt, the highest attempt of that
// request id answered with a refusal (0 if none), and whether a grant made under it has ended.
type StaleAttempt struct {
	RequestID         string
	Attempt, Answered uint32
	GrantEnded        bool
}

// Ref names a lease, or the lock-delay its expiry began: a resource and a token.
type Ref struct {
	Resource string
	Token    uint64
}

// Checkpoint is a checkpoint applied to a current lease: its remaining TTL when the leader proposed it, and
// whether it was renewed since the previous checkpoint.
type Checkpoint struct {
	Resource    string
	Token       uint64
	RemainingMs int64
	Renewed     bool
}

// Event is one change of a resource's lease, for watchers.
type Event struct {
	Type  leasepb.EventType
	Index uint64
	Lease Lease
	// By is the identity that released another identity's lease (an admin); "" otherwise.
	By string
}

// Proto converts the event to its wire form.
func (e Event) Proto() *leasepb.Event {
	return &leasepb.Event{Type: e.Type, Index: e.Index, Lease: e.Lease.Proto()}
}
