package fencetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leased/leased/client/fence"
)

// caseTimeout bounds every case; the workloads stop themselves well before.
const caseTimeout = 3 * time.Minute

var errInjected = errors.New("fencetest: injected caller failure")

type testCase struct {
	name    string
	durable bool // needs a Reopener
	run     func(ctx context.Context, t *testing.T, h Harness)
}

var cases = []testCase{
	{"InvalidInput", false, testInvalidInput},
	{"FirstWriteAccepted", false, testFirstWrite},
	{"EqualTokensAccepted", false, testEqualTokens},
	{"StaleWriteLeavesNoTrace", false, testStaleLeavesNoTrace},
	{"TokensCompareNumerically", false, testNumericOrder},
	{"FailingWriteLeavesNoTrace", false, testFailingWrite},
	{"ResourcesAreIndependent", false, testIndependentResources},
	{"ResourceNames", false, testResourceNames},
	{"ConcurrentWriters", false, testConcurrentWriters},
	{"ManyResources", false, testManyResources},
	{"ClaimInvalidInput", false, testClaimInvalidInput},
	{"ClaimRecordsToken", false, testClaimRecordsToken},
	{"ClaimFencesPausedHolder", false, testClaimFencesPausedHolder},
	{"ConcurrentClaims", false, testConcurrentClaims},
	{"Reopen", true, testReopen},
	{"ClaimReopen", true, testClaimReopen},
	{"ReopenDuringConcurrentWriters", true, testReopenDuringWriters},
}

func testInvalidInput(ctx context.Context, t *testing.T, h Harness) {
	if err := h.Append(ctx, "", 1, "x"); !errors.Is(err, fence.ErrInvalidResource) {
		t.Errorf("Append with empty resource = %v, want ErrInvalidResource", err)
	}
	if err := h.Append(ctx, "r", 0, "x"); !errors.Is(err, fence.ErrInvalidToken) {
		t.Errorf("Append with token 0 = %v, want ErrInvalidToken", err)
	}
	if err := h.Append(ctx, "r", fence.MaxToken+1, "x"); !errors.Is(err, fence.ErrInvalidToken) {
		t.Errorf("Append with token MaxToken+1 = %v, want ErrInvalidToken", err)
	}
	expectState(ctx, t, h, "r", 0, nil)
}

func testFirstWrite(ctx context.Context, t *testing.T, h Harness) {
	expectState(ctx, t, h, "r", 0, nil)
	mustAppend(ctx, t, h, "r", 1, "a")
	expectState(ctx, t, h, "r", 1, []string{"a"})
	mustAppend(ctx, t, h, "r", 8, "b")
	expectState(ctx, t, h, "r", 8, []string{"a", "b"})
}

func testEqualTokens(ctx context.Context, t *testing.T, h Harness) {
	mustAppend(ctx, t, h, "r", 5, "a")
	mustAppend(ctx, t, h, "r", 5, "b")
	mustAppend(ctx, t, h, "r", 5, "c")
	expectState(ctx, t, h, "r", 5, []string{"a", "b", "c"})
}

func testStaleLeavesNoTrace(ctx context.Context, t *testing.T, h Harness) {
	mustAppend(ctx, t, h, "r", 5, "a")
	expectStale(t, h.Append(ctx, "r", 3, "stale"), "r", 3, 5)
	expectStale(t, h.Append(ctx, "r", 4, "stale"), "r", 4, 5)
	expectState(ctx, t, h, "r", 5, []string{"a"})
	expectStale(t, h.AppendThenFail(ctx, "r", 1, "stale", errInjected), "r", 1, 5)
	expectState(ctx, t, h, "r", 5, []string{"a"})
}

// testNumericOrder catches stores that compare tokens as strings ("9" > "10")
// or as floating point numbers (precision is lost above 2^53).
func testNumericOrder(ctx context.Context, t *testing.T, h Harness) {
	mustAppend(ctx, t, h, "r", 9, "a")
	mustAppend(ctx, t, h, "r", 10, "b")
	expectStale(t, h.Append(ctx, "r", 9, "stale"), "r", 9, 10)
	mustAppend(ctx, t, h, "r", 100, "c")
	expectState(ctx, t, h, "r", 100, []string{"a", "b", "c"})

	const big = uint64(1)<<53 + 1 // not representable as a float64
	mustAppend(ctx, t, h, "big", big, "a")
	expectStale(t, h.Append(ctx, "big", big-1, "stale"), "big", big-1, big)
	mustAppend(ctx, t, h, "big", fence.MaxToken-1, "b")
	mustAppend(ctx, t, h, "big", fence.MaxToken, "c")
	expectStale(t, h.Append(ctx, "big", fence.MaxToken-1, "stale"), "big", fence.MaxToken-1, fence.MaxToken)
	expectState(ctx, t, h, "big", fence.MaxToken, []string{"a", "b", "c"})
}

func testFailingWrite(ctx context.Context, t *testing.T, h Harness) {
	// On a fresh resource: no token may be recorded.
	expectFailure(t, h.AppendThenFail(ctx, "fresh", 4, "x", errInjected))
	expectState(ctx, t, h, "fresh", 0, nil)
	// A lower token is still accepted afterwards: 4 was never recorded.
	mustAppend(ctx, t, h, "fresh", 2, "a")
	expectState(ctx, t, h, "fresh", 2, []string{"a"})

	// On an existing resource, with a higher and with an equal token.
	mustAppend(ctx, t, h, "r", 5, "a")
	expectFailure(t, h.AppendThenFail(ctx, "r", 9, "x", errInjected))
	expectFailure(t, h.AppendThenFail(ctx, "r", 5, "y", errInjected))
	expectState(ctx, t, h, "r", 5, []string{"a"})
	mustAppend(ctx, t, h, "r", 6, "b")
	expectState(ctx, t, h, "r", 6, []string{"a", "b"})
}

func testIndependentResources(ctx context.Context, t *testing.T, h Harness) {
	mustAppend(ctx, t, h, "r1", 10, "a")
	mustAppend(ctx, t, h, "r2", 1, "b")
	expectStale(t, h.Append(ctx, "r1", 2, "stale"), "r1", 2, 10)
	mustAppend(ctx, t, h, "r2", 2, "c")
	expectState(ctx, t, h, "r1", 10, []string{"a"})
	expectState(ctx, t, h, "r2", 2, []string{"b", "c"})
}

func testResourceNames(ctx context.Context, t *testing.T, h Harness) {
	names := []string{
		"a", "orders/2024-01", "key with spaces", "ключ-ресурса", "{tag}:x*?[]",
		"'; DROP TABLE x; --", strings.Repeat("n", 256),
	}
	for i, name := range names {
		token := uint64(i + 2)
		mustAppend(ctx, t, h, name, token, fmt.Sprintf("v%d", i))
		expectStale(t, h.Append(ctx, name, token-1, "stale"), name, token-1, token)
	}
	for i, name := range names {
		expectState(ctx, t, h, name, uint64(i+2), []string{fmt.Sprintf("v%d", i)})
	}
}

// mustAppend performs a write that must be accepted.
func mustAppend(ctx context.Context, t *testing.T, h Harness, resource string, token uint64, value string) {
	t.Helper()
	if err := h.Append(ctx, resource, token, value); err != nil {
		t.Fatalf("Append(%q, %d, %q) = %v, want accepted", resource, token, value, err)
	}
}

// expectStale checks that err is a *fence.StaleTokenError with the given
// fields.
func expectStale(t *testing.T, err error, resource string, token, highest uint64) {
	t.Helper()
	var stale *fence.StaleTokenError
	switch {
	case err == nil:
		t.Errorf("write %q token %d accepted, want stale (highest %d)", resource, token, highest)
	case !errors.Is(err, fence.ErrStaleToken):
		t.Errorf("write %q token %d = %v, want errors.Is(err, fence.ErrStaleToken)", resource, token, err)
	case !errors.As(err, &stale):
		t.Errorf("write %q token %d = %v, want a *fence.StaleTokenError", resource, token, err)
	case stale.Resource != resource || stale.Token != token || stale.Highest != highest:
		t.Errorf("stale error = %+v, want {Resource:%q Token:%d Highest:%d}", *stale, resource, token, highest)
	}
}

// expectFailure checks that err carries the injected caller failure.
func expectFailure(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, errInjected) || errors.Is(err, fence.ErrStaleToken) {
		t.Errorf("failing write = %v, want the caller's failure %v", err, errInjected)
	}
}

// expectState checks the highest token and the history of resource.
func expectState(ctx context.Context, t *testing.T, h Harness, resource string, highest uint64, history []string) {
	t.Helper()
	got, err := h.Highest(ctx, resource)
	if err != nil {
		t.Fatalf("Highest(%q): %v", resource, err)
	}
	if got != highest {
		t.Errorf("Highest(%q) = %d, want %d", resource, got, highest)
	}
	hist, err := h.History(ctx, resource)
	if err != nil {
		t.Fatalf("History(%q): %v", resource, err)
	}
	if !slices.Equal(hist, history) {
		t.Errorf("History(%q) = %q, want %q", resource, hist, history)
	}
}
