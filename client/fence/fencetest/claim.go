package fencetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leased/leased/client/fence"
)

func testClaimInvalidInput(ctx context.Context, t *testing.T, h Harness) {
	if err := h.Claim(ctx, "", 1); !errors.Is(err, fence.ErrInvalidResource) {
		t.Errorf("Claim with empty resource = %v, want ErrInvalidResource", err)
	}
	if err := h.Claim(ctx, "r", 0); !errors.Is(err, fence.ErrInvalidToken) {
		t.Errorf("Claim with token 0 = %v, want ErrInvalidToken", err)
	}
	if err := h.Claim(ctx, "r", fence.MaxToken+1); !errors.Is(err, fence.ErrInvalidToken) {
		t.Errorf("Claim with token MaxToken+1 = %v, want ErrInvalidToken", err)
	}
	expectState(ctx, t, h, "r", 0, nil)
}

// testClaimRecordsToken: a claim records the token and writes nothing; it
// follows the >= rule of a write, and so do the writes after it.
func testClaimRecordsToken(ctx context.Context, t *testing.T, h Harness) {
	mustClaim(ctx, t, h, "fresh", 4)
	expectState(ctx, t, h, "fresh", 4, nil)

	mustAppend(ctx, t, h, "r", 5, "a")
	mustClaim(ctx, t, h, "r", 5) // equal: accepted
	mustClaim(ctx, t, h, "r", 9)
	expectState(ctx, t, h, "r", 9, []string{"a"})
	expectStale(t, h.Claim(ctx, "r", 8), "r", 8, 9)
	expectStale(t, h.Append(ctx, "r", 5, "stale"), "r", 5, 9)
	expectState(ctx, t, h, "r", 9, []string{"a"})
	mustAppend(ctx, t, h, "r", 9, "b")
	expectState(ctx, t, h, "r", 9, []string{"a", "b"})
}

// testClaimFencesPausedHolder is the scenario Claim exists for: the old
// holder (token 3) has written, pauses, loses its lease; the new holder
// (token 7) claims at once but has nothing to write yet. The old holder's
// late write must be refused all the same.
func testClaimFencesPausedHolder(ctx context.Context, t *testing.T, h Harness) {
	mustAppend(ctx, t, h, "r", 3, "old-1")
	mustClaim(ctx, t, h, "r", 7)
	expectStale(t, h.Append(ctx, "r", 3, "old-late"), "r", 3, 7)
	expectStale(t, h.AppendThenFail(ctx, "r", 3, "old-late", errInjected), "r", 3, 7)
	expectState(ctx, t, h, "r", 7, []string{"old-1"})
}

// testConcurrentClaims races claimers raising the token of a resource
// against writers appending with tokens around it. A write invoked after a
// claim of token C returned must not be accepted with a token below C, and
// accepted writes stay in token order.
func testConcurrentClaims(ctx context.Context, t *testing.T, h Harness) {
	const resource, claimers, writers, ops = "claimed", 3, 4, 40
	deadline := time.Now().Add(20 * time.Second)
	var claimed, next atomic.Uint64 // highest claim that returned; token source
	var mu sync.Mutex
	accepted := make(map[string]uint64)
	var wg sync.WaitGroup
	for c := range claimers {
		wg.Go(func() {
			for i := 0; i < ops && time.Now().Before(deadline) && ctx.Err() == nil; i++ {
				token := next.Add(1)
				err := h.Claim(ctx, resource, token)
				if err == nil {
					raise(&claimed, token)
				} else if !errors.Is(err, fence.ErrStaleToken) && ctx.Err() == nil {
					t.Errorf("claimer %d: Claim(%d) = %v", c, token, err)
				}
			}
		})
	}
	for w := range writers {
		wg.Go(func() {
			for i := 0; i < ops && time.Now().Before(deadline) && ctx.Err() == nil; i++ {
				floor := claimed.Load()
				token := max(next.Load(), 2) - 1 // at or just below the newest token
				value := fmt.Sprintf("%d:w%d:i%d", token, w, i)
				err := h.Append(ctx, resource, token, value)
				switch {
				case err == nil && token < floor:
					t.Errorf("write with token %d accepted after a claim of %d returned", token, floor)
				case err == nil:
					mu.Lock()
					accepted[value] = token
					mu.Unlock()
				case !errors.Is(err, fence.ErrStaleToken) && ctx.Err() == nil:
					t.Errorf("writer %d: Append(%d) = %v", w, token, err)
				}
			}
		})
	}
	wg.Wait()
	hist, err := h.History(ctx, resource)
	if err != nil {
		t.Fatalf("History: %v", err)
	}
	checkHistory(t, resource, hist, accepted)
	highest, err := h.Highest(ctx, resource)
	if err != nil {
		t.Fatalf("Highest: %v", err)
	}
	if c := claimed.Load(); highest < c {
		t.Errorf("Highest = %d, below the claim of %d that returned", highest, c)
	}
}

// raise sets v to max(v, x).
func raise(v *atomic.Uint64, x uint64) {
	for {
		old := v.Load()
		if x <= old || v.CompareAndSwap(old, x) {
			return
		}
	}
}

// mustClaim performs a claim that must be accepted.
func mustClaim(ctx context.Context, t *testing.T, h Harness, resource string, token uint64) {
	t.Helper()
	if err := h.Claim(ctx, resource, token); err != nil {
		t.Fatalf("Claim(%q, %d) = %v, want accepted", resource, token, err)
	}
}

// testClaimReopen: a claimed token survives a restart of the store, as an
// accepted write's does.
func testClaimReopen(ctx context.Context, t *testing.T, h Harness) {
	mustAppend(ctx, t, h, "r", 2, "a")
	mustClaim(ctx, t, h, "r", 6)
	if err := h.(Reopener).Reopen(ctx); err != nil {
		t.Fatalf("Reopen: %v", err)
	}
	expectState(ctx, t, h, "r", 6, []string{"a"})
	expectStale(t, h.Append(ctx, "r", 2, "stale"), "r", 2, 6)
}
