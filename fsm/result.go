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
	// NotCurrent: Release or Renew named a token that is not the resource's current grant.
	NotCurrent
	// HolderLimit: Acquire would exceed the command's holder_limit.
	HolderLimit
	// Invalid: the command was malformed (empty names, a non-positive TTL). Nothing changed. The server
	// validates requests before proposing them, so this only guards against a faulty proposer.
	Invalid
)

var codeNames = [...]string{"ok", "held", "lock-delayed", "not-current", "holder-limit", "invalid"}

// String names the code in lowercase.
func (c Code) String() string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	return "unknown"
}

// Result is what applying one command produced.
type Result struct {
	Code Code
	// Lease is the grant for a successful Acquire (new or replayed), the current grant for Held, and the
	// released lease for Release.
	Lease Lease
	// Replayed is true when Acquire returned an existing grant made under the same request id.
	Replayed bool
	// Delay is set for LockDelayed.
	Delay LockDelay
	// Events are the watch events this command caused, in order; each carries the entry's index.
	Events []Event
}

// Event is one change of a resource's lease, for watchers.
type Event struct {
	Type  leasepb.EventType
	Index uint64
	Lease Lease
}

// Proto converts the event to its wire form.
func (e Event) Proto() *leasepb.Event {
	return &leasepb.Event{Type: e.Type, Index: e.Index, Lease: e.Lease.Proto()}
}
