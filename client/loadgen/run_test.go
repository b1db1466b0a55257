package loadgen_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/leased/leased/client/loadgen"
)

// Run stops at MaxOps, hands each worker its own sequence, counts failures and orders the latencies.
func TestRunCountsEveryOperation(t *testing.T) {
	var mu sync.Mutex
	seen := map[[2]int]bool{}
	boom := errors.New("boom")
	op := func(_ context.Context, worker, seq int) error {
		mu.Lock()
		defer mu.Unlock()
		if seen[[2]int{worker, seq}] {
			t.Errorf("worker %d seq %d ran twice", worker, seq)
		}
		seen[[2]int{worker, seq}] = true
		if seq%4 == 3 {
			return boom
		}
		return nil
	}
	r, err := loadgen.Run(context.Background(), loadgen.Options{Clients: 4, Duration: time.Minute, MaxOps: 400}, op)
	if err != nil {
		t.Fatal(err)
	}
	if r.Ops != 400 || len(seen) != 400 {
		t.Fatalf("ops %d, ran %d, want 400", r.Ops, len(seen))
	}
	if r.Errors == 0 || r.Errors >= r.Ops || !errors.Is(r.FirstErr, boom) {
		t.Fatalf("errors %d of %d, first %v", r.Errors, r.Ops, r.FirstErr)
	}
	if !(r.P50 <= r.P90 && r.P90 <= r.P99 && r.P99 <= r.Max) || r.Elapsed <= 0 || r.Rate() <= 0 {
		t.Fatalf("result out of order: %+v", r)
	}
}

// Run ends at its duration even when the operation cap is far away, and the latencies are the operations'.
func TestRunEndsAtDuration(t *testing.T) {
	const pause = 2 * time.Millisecond
	op := func(ctx context.Context, _, _ int) error {
		select {
		case <-time.After(pause):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	r, err := loadgen.Run(context.Background(), loadgen.Options{Clients: 2, Duration: 100 * time.Millisecond}, op)
	if err != nil {
		t.Fatal(err)
	}
	if r.Ops == 0 || r.Errors != 0 || r.P50 < pause || r.Elapsed < 100*time.Millisecond {
		t.Fatalf("%+v", r)
	}
}

// OpTimeout bounds each operation: one that would block forever fails with DeadlineExceeded.
func TestRunBoundsEachOperation(t *testing.T) {
	block := func(ctx context.Context, _, _ int) error {
		<-ctx.Done()
		return ctx.Err()
	}
	r, err := loadgen.Run(context.Background(),
		loadgen.Options{Clients: 2, Duration: time.Minute, MaxOps: 4, OpTimeout: 20 * time.Millisecond}, block)
	if err != nil {
		t.Fatal(err)
	}
	if r.Ops != 4 || r.Errors != 4 || !errors.Is(r.FirstErr, context.DeadlineExceeded) || r.P50 < 20*time.Millisecond {
		t.Fatalf("%+v", r)
	}
}

// A cancelled context ends the run; nothing starts after it.
func TestRunStopsOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r, err := loadgen.Run(ctx, loadgen.Options{Clients: 3, Duration: time.Hour}, func(context.Context, int, int) error {
		t.Error("an operation ran after cancel")
		return nil
	})
	if err != nil || r.Ops != 0 {
		t.Fatalf("ops %d, err %v", r.Ops, err)
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, o := range []loadgen.Options{
		{Clients: 0, Duration: time.Second},
		{Clients: loadgen.MaxClients + 1, Duration: time.Second},
		{Clients: 1, Duration: 0},
		{Clients: 1, Duration: time.Second, MaxOps: -1},
		{Clients: 1, Duration: time.Second, MaxOps: loadgen.MaxOpsLimit + 1},
		{Clients: 1, Duration: time.Second, OpTimeout: -time.Second},
	} {
		if _, err := loadgen.Run(context.Background(), o, nil); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
}
