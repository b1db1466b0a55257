// Package loadgen drives a cluster with a bounded, timed load and measures every operation's latency. It
// is the engine of `leasectl bench` and of the side-by-side comparison with etcd in bench/ (which hands
// it etcd operations too, so both systems are measured by the same loop); workloads.go holds the leased
// operations through the SDK, keepalive.go the batched renewals through the raw API (and Fill, which
// both sides of bench/ take their leases with), failover.go the passive outage measurement. Every run
// ends at its duration, its operation cap or its context, whichever comes first.
package loadgen

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// DefaultMaxOps caps a run's operations when Options.MaxOps is 0, so that the latencies it keeps (8 bytes
// each) stay bounded whatever the duration.
const DefaultMaxOps = 5_000_000

// MaxClients is the most workers a run may have.
const MaxClients = 10_000

// MaxOpsLimit is the largest Options.MaxOps (400 MB of latencies).
const MaxOpsLimit = 50_000_000

// Op is one operation of a workload. worker (0..Clients-1) names the goroutine that runs it and seq counts
// that worker's operations from 0, so an operation can pick a fresh name without sharing state.
type Op func(ctx context.Context, worker, seq int) error

// Options bound a run.
type Options struct {
	// Clients is the number of concurrent workers, each running one operation at a time (1..MaxClients).
	Clients int
	// Duration is how long workers start new operations (more than 0).
	Duration time.Duration
	// MaxOps stops the run after this many operations in all; 0 means DefaultMaxOps.
	MaxOps int
	// OpTimeout bounds each operation (its context's deadline); 0 leaves operations to ctx alone.
	OpTimeout time.Duration
}

// Result is what a run measured. Latencies are those of every operation, failed ones included.
type Result struct {
	Ops, Errors        int // operations run, and those of them that failed
	Elapsed            time.Duration
	P50, P90, P99, Max time.Duration
	// FirstErr is the first failure (nil without one), to tell a user what went wrong.
	FirstErr error
}

// Rate is the successful operations per second.
func (r Result) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Ops-r.Errors) / r.Elapsed.Seconds()
}

// Validate says what is wrong with o, if anything.
func (o Options) Validate() error {
	switch {
	case o.Clients < 1 || o.Clients > MaxClients:
		return fmt.Errorf("clients must be in 1..%d, not %d", MaxClients, o.Clients)
	case o.Duration <= 0:
		return fmt.Errorf("duration must be more than 0, not %v", o.Duration)
	case o.MaxOps < 0 || o.MaxOps > MaxOpsLimit:
		return fmt.Errorf("max ops must be in 0..%d, not %d", MaxOpsLimit, o.MaxOps)
	case o.OpTimeout < 0:
		return fmt.Errorf("op timeout must not be negative, not %v", o.OpTimeout)
	}
	return nil
}

// Run runs op on o.Clients workers until o.Duration has passed, o.MaxOps operations were started or ctx
// ends, waits for the operations in flight, and returns what it measured. Each operation gets ctx (with
// o.OpTimeout), which Run does not cancel at the duration: an operation in flight then finishes and counts.
func Run(ctx context.Context, o Options, op Op) (Result, error) {
	if err := o.Validate(); err != nil {
		return Result{}, err
	}
	maxOps := o.MaxOps
	if maxOps == 0 {
		maxOps = DefaultMaxOps
	}
	var (
		mu       sync.Mutex
		started  int
		errs     int
		firstErr error
		lats     = make([][]time.Duration, o.Clients)
		wg       sync.WaitGroup
	)
	// claim reserves the next operation, or says the run is over.
	deadline := time.Now().Add(o.Duration)
	claim := func() bool {
		if ctx.Err() != nil || !time.Now().Before(deadline) {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		if started >= maxOps {
			return false
		}
		started++
		return true
	}
	begin := time.Now()
	for w := range o.Clients {
		wg.Go(func() {
			for seq := 0; claim(); seq++ {
				t0 := time.Now()
				err := runOne(ctx, o.OpTimeout, op, w, seq)
				lats[w] = append(lats[w], time.Since(t0))
				if err != nil {
					mu.Lock()
					if errs == 0 {
						firstErr = err
					}
					errs++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	r := Result{Ops: started, Errors: errs, Elapsed: time.Since(begin), FirstErr: firstErr}
	all := slices.Concat(lats...)
	slices.Sort(all)
	r.P50, r.P90, r.P99 = quantile(all, 0.50), quantile(all, 0.90), quantile(all, 0.99)
	if len(all) > 0 {
		r.Max = all[len(all)-1]
	}
	return r, nil
}

// runOne runs one operation, bounded by timeout when it is set.
func runOne(ctx context.Context, timeout time.Duration, op Op, worker, seq int) error {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	return op(ctx, worker, seq)
}

// quantile is the q-quantile of sorted (nearest rank); 0 for none.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
