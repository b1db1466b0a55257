package server

import "sync/atomic"

// testHooks are points where a test may step in; all nil outside tests.
type testHooks struct {
	// handoffProposing runs after a release claimed a waiter and before it proposes the entry that
	// carries the waiter's grant, on the release's goroutine.
	handoffProposing atomic.Pointer[func()]
}
