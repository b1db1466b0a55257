package fencetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leased/leased/client/fence"
)

// workload describes concurrent writers racing with random tokens on a few
// resources. Every loop is bounded by a count and by duration.
type workload struct {
	writers      int
	opsPerWriter int
	resources    int
	reopens      int // Reopen calls made while the writers run
	duration     time.Duration
}

// outcome is what the writers observed: the values accepted per resource.
type outcome struct {
	mu       sync.Mutex
	accepted map[string]map[string]uint64 // resource -> value -> token
	ops      atomic.Int64
	stale    atomic.Int64
	reopens  atomic.Int64
}

func (o *outcome) accept(resource, value string, token uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.accepted[resource][value] = token
}

func testConcurrentWriters(ctx context.Context, t *testing.T, h Harness) {
	w := workload{writers: 8, opsPerWriter: 40, resources: 3, duration: 20 * time.Second}
	o := runWorkload(ctx, t, h, w)
	checkOutcome(ctx, t, h, o)
}

func testReopenDuringWriters(ctx context.Context, t *testing.T, h Harness) {
	w := workload{writers: 6, opsPerWriter: 40, resources: 3, reopens: 3, duration: 20 * time.Second}
	o := runWorkload(ctx, t, h, w)
	checkOutcome(ctx, t, h, o)
	if err := h.(Reopener).Reopen(ctx); err != nil {
		t.Fatalf("Reopen after writers: %v", err)
	}
	checkOutcome(ctx, t, h, o)
}

func testReopen(ctx context.Context, t *testing.T, h Harness) {
	r := h.(Reopener)
	mustAppend(ctx, t, h, "r1", 5, "a")
	mustAppend(ctx, t, h, "r2", 3, "b")
	if err := r.Reopen(ctx); err != nil {
		t.Fatalf("Reopen: %v", err)
	}
	expectState(ctx, t, h, "r1", 5, []string{"a"})
	expectState(ctx, t, h, "r2", 3, []string{"b"})
	expectStale(t, h.Append(ctx, "r1", 4, "stale"), "r1", 4, 5)
	expectFailure(t, h.AppendThenFail(ctx, "r2", 7, "x", errInjected))
	mustAppend(ctx, t, h, "r1", 5, "c")
	if err := r.Reopen(ctx); err != nil {
		t.Fatalf("Reopen: %v", err)
	}
	expectState(ctx, t, h, "r1", 5, []string{"a", "c"})
	expectState(ctx, t, h, "r2", 3, []string{"b"})
}

// runWorkload runs w against h and returns what the writers observed. Each
// writer checks every rejection it gets on the spot.
func runWorkload(ctx context.Context, t *testing.T, h Harness, w workload) *outcome {
	seed := uint64(time.Now().UnixNano())
	t.Logf("workload seed %d", seed)
	o := &outcome{accepted: make(map[string]map[string]uint64)}
	for i := range w.resources {
		o.accepted[resourceName(i)] = make(map[string]uint64)
	}
	deadline := time.Now().Add(w.duration)
	progress := make(chan struct{}, 1)
	done := make(chan struct{})

	var reopener sync.WaitGroup
	if w.reopens > 0 {
		reopener.Go(func() { reopenWhileWriting(ctx, t, h.(Reopener), w, o, progress, done) })
	}
	var writers sync.WaitGroup
	for id := range w.writers {
		writers.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(id)))
			for i := 0; i < w.opsPerWriter && time.Now().Before(deadline) && ctx.Err() == nil; i++ {
				writeOnce(ctx, t, h, o, rng, id, i, w)
				select {
				case progress <- struct{}{}:
				default:
				}
			}
		})
	}
	writers.Wait()
	close(done)
	reopener.Wait()
	t.Logf("workload: %d writes, %d stale, %d reopens during writes", o.ops.Load(), o.stale.Load(), o.reopens.Load())
	return o
}

// writeOnce makes one random write. Tokens drift upward with the writes
// made by all writers so far, however the scheduler interleaves them, so that
// a run mixes accepted, equal and stale tokens.
func writeOnce(ctx context.Context, t *testing.T, h Harness, o *outcome, rng *rand.Rand, writer, i int, w workload) {
	resource := resourceName(rng.IntN(w.resources))
	token := uint64(o.ops.Load())/uint64(w.writers) + 1 + rng.Uint64N(8)
	value := fmt.Sprintf("%d:w%d:i%d", token, writer, i)
	err := h.Append(ctx, resource, token, value)
	o.ops.Add(1)
	var stale *fence.StaleTokenError
	switch {
	case err == nil:
		o.accept(resource, value, token)
	case errors.As(err, &stale):
		o.stale.Add(1)
		if stale.Resource != resource || stale.Token != token || stale.Highest <= token {
			t.Errorf("write %q token %d: bad stale error %+v", resource, token, *stale)
		}
	case ctx.Err() != nil:
	default:
		t.Errorf("write %q token %d: %v", resource, token, err)
	}
}

// reopenWhileWriting reopens the store w.reopens times, spread over the
// writes, until the writers are done.
func reopenWhileWriting(ctx context.Context, t *testing.T, r Reopener, w workload, o *outcome, progress <-chan struct{}, done <-chan struct{}) {
	every := int64(w.writers * w.opsPerWriter / (w.reopens + 1))
	for k := 1; k <= w.reopens; k++ {
		for o.ops.Load() < every*int64(k) {
			select {
			case <-progress:
			case <-done:
				return
			}
		}
		if err := r.Reopen(ctx); err != nil {
			t.Errorf("Reopen during writes: %v", err)
			return
		}
		o.reopens.Add(1)
	}
}

// checkOutcome verifies invariant I5 and the final state for every resource:
// the history holds exactly the accepted writes, in an order whose tokens
// never decrease, and ends with a write of the highest accepted token.
func checkOutcome(ctx context.Context, t *testing.T, h Harness, o *outcome) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	for resource, accepted := range o.accepted {
		hist, err := h.History(ctx, resource)
		if err != nil {
			t.Fatalf("History(%q): %v", resource, err)
		}
		checkHistory(t, resource, hist, accepted)
		var want uint64
		for _, token := range accepted {
			want = max(want, token)
		}
		got, err := h.Highest(ctx, resource)
		if err != nil {
			t.Fatalf("Highest(%q): %v", resource, err)
		}
		if got != want {
			t.Errorf("Highest(%q) = %d, want the highest accepted token %d", resource, got, want)
		}
		if len(hist) > 0 && tokenOf(hist[len(hist)-1]) != want {
			t.Errorf("resource %q: final value %q does not belong to the highest accepted token %d",
				resource, hist[len(hist)-1], want)
		}
	}
}

func checkHistory(t *testing.T, resource string, hist []string, accepted map[string]uint64) {
	t.Helper()
	if len(hist) != len(accepted) {
		t.Errorf("resource %q: history has %d writes, %d were accepted", resource, len(hist), len(accepted))
	}
	seen := make(map[string]bool, len(hist))
	var prev uint64
	for i, v := range hist {
		if _, ok := accepted[v]; !ok || seen[v] {
			t.Errorf("resource %q: history[%d] = %q was not accepted exactly once", resource, i, v)
		}
		seen[v] = true
		token := tokenOf(v)
		if token < prev {
			t.Errorf("I5 violated on %q: token %d accepted after %d (history[%d] = %q)", resource, token, prev, i, v)
		}
		prev = max(prev, token)
	}
}

func resourceName(i int) string { return "res-" + strconv.Itoa(i) }

// tokenOf parses the token a workload value starts with.
func tokenOf(value string) uint64 {
	s, _, _ := strings.Cut(value, ":")
	token, _ := strconv.ParseUint(s, 10, 64)
	return token
}

// testManyResources fences 1,000 resources at once: each gets one accepted
// and one stale write, spread over a few workers.
func testManyResources(ctx context.Context, t *testing.T, h Harness) {
	const n, workers = 1000, 8
	deadline := time.Now().Add(60 * time.Second)
	tokenFor := func(i int) uint64 { return uint64(i%13 + 2) }
	var next, done atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for time.Now().Before(deadline) && ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				r, token := fmt.Sprintf("many-%04d", i), tokenFor(i)
				if err := h.Append(ctx, r, token, "v"+strconv.Itoa(i)); err != nil {
					t.Errorf("Append(%q, %d) = %v, want accepted", r, token, err)
					continue
				}
				expectStale(t, h.Append(ctx, r, token-1, "stale"), r, token-1, token)
				done.Add(1)
			}
		})
	}
	wg.Wait()
	if got := done.Load(); got != n {
		t.Fatalf("only %d of %d resources written before the deadline", got, n)
	}
	for i := range n {
		if ctx.Err() != nil || time.Now().After(deadline.Add(30*time.Second)) {
			t.Fatalf("checking resources: out of time at %d", i)
		}
		expectState(ctx, t, h, fmt.Sprintf("many-%04d", i), tokenFor(i), []string{"v" + strconv.Itoa(i)})
	}
}
