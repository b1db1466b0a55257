// Package fencetest is the conformance suite for fence adapters. Every
// adapter in this module runs it, and the author of a new adapter can run it
// against theirs:
//
//	func TestConformance(t *testing.T) {
//		fencetest.Run(t, func(t *testing.T) fencetest.Harness {
//			return newMyHarness(t) // fresh, isolated store; cleanup via t.Cleanup
//		})
//	}
//
// The suite checks the contract of package fence: a write is accepted iff its
// token is >= every token accepted for the resource, atomically with the
// write; a rejected write returns a *fence.StaleTokenError and leaves no
// trace; a claim records a token under the same rule without writing data,
// and refuses every later write with a lower token; a failing caller write leaves the token and the data unchanged;
// and invariant I5 (accepted tokens never decrease) holds under concurrent
// writers and, for durable stores, across reopens.
//
// The suite talks to the adapter through a Harness, whose fenced write
// appends a value to a per-resource history kept in the same store. Because
// each append happens inside the adapter's atomic step, the history is the
// order in which the store accepted writes, and the suite can check that the
// tokens along it never decrease.
//
// Every loop in the suite is bounded in count and in time.
package fencetest

import (
	"context"
	"testing"
)

// Harness adapts one fence adapter, over one isolated store, to the suite.
// All methods must be safe for concurrent use, including with Reopen.
//
// Resource names used by the suite are non-empty UTF-8 strings of at most
// 256 bytes; values are printable ASCII without newlines, at most 64 bytes.
type Harness interface {
	// Append performs one fenced write through the adapter: for resource
	// with token, it appends value to the resource's history inside the
	// adapter's atomic step. It returns the adapter's error unchanged or
	// wrapped (a *fence.StaleTokenError when the token is stale).
	Append(ctx context.Context, resource string, token uint64, value string) error

	// AppendThenFail performs a fenced write whose caller-supplied part
	// appends value and then fails, inside the atomic step. It must return
	// an error that matches failure with errors.Is when the token check
	// passed (the failure made the step roll back), or the adapter's stale
	// error when it did not. For a store without rollback (Redis), the
	// caller part may instead be one the adapter rejects before writing
	// anything; the harness then joins failure to the adapter's error.
	AppendThenFail(ctx context.Context, resource string, token uint64, value string, failure error) error

	// Claim records token for resource through the adapter's Claim, which
	// checks and records it as a fenced write does but writes no data.
	Claim(ctx context.Context, resource string, token uint64) error

	// History returns the values appended to resource, oldest first; none
	// for an unknown resource.
	History(ctx context.Context, resource string) ([]string, error)

	// Highest returns the highest token the adapter has accepted for
	// resource, or 0 if it has accepted none.
	Highest(ctx context.Context, resource string) (uint64, error)
}

// Reopener is implemented by harnesses over durable stores. Reopen closes
// the store and opens it again (or drops every connection and reconnects),
// as a restart of the adapter's process would. It may be called concurrently
// with the other methods; a simple implementation excludes them with a
// sync.RWMutex while it reopens. The suite's reopen cases are skipped for
// harnesses that do not implement it.
type Reopener interface {
	Reopen(ctx context.Context) error
}

// NewHarness returns a harness over a fresh, empty, isolated store. It is
// called once per subtest and should register its cleanup with t.Cleanup.
type NewHarness func(t *testing.T) Harness

// Run runs the conformance suite, one subtest per case.
func Run(t *testing.T, newHarness NewHarness) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			if c.durable {
				if _, ok := h.(Reopener); !ok {
					t.Skip("harness does not implement fencetest.Reopener (not a durable store)")
				}
			}
			ctx, cancel := context.WithTimeout(t.Context(), caseTimeout)
			defer cancel()
			c.run(ctx, t, h)
		})
	}
}
