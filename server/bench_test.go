package server_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest"
)

// The latency benchmarks run against an in-process 3-node cluster on loopback, calling the leader.
// Run: go test -run '^$' -bench 'Acquire|Renew' -benchtime 3s ./server/

func BenchmarkAcquire(b *testing.B) {
	for _, callers := range []int{1, 64} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			c := newBenchCluster(b)
			cl := c.Leases(c.WaitLeader())
			var seq atomic.Int64
			runCallers(b, callers, func(ctx context.Context) error {
				i := seq.Add(1)
				_, err := cl.Acquire(ctx, &leasepb.AcquireRequest{Resource: fmt.Sprintf("b/%d", i), Holder: "bench", TtlMs: 60_000, RequestId: fmt.Sprint(i)})
				return err
			})
		})
	}
}

func BenchmarkRenew(b *testing.B) {
	for _, callers := range []int{1, 64} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			c := newBenchCluster(b)
			cl := c.Leases(c.WaitLeader())
			ctx := context.Background()
			refs := make([]*leasepb.RenewRequest, callers)
			for i := range refs {
				resp, err := cl.Acquire(ctx, &leasepb.AcquireRequest{Resource: fmt.Sprintf("r/%d", i), Holder: fmt.Sprintf("h%d", i), TtlMs: 60_000})
				if err != nil {
					b.Fatal(err)
				}
				refs[i] = &leasepb.RenewRequest{Resource: resp.GetLease().GetResource(), Token: resp.GetLease().GetToken()}
			}
			var seq atomic.Int64
			runCallers(b, callers, func(ctx context.Context) error {
				_, err := cl.Renew(ctx, refs[int(seq.Add(1))%callers])
				return err
			})
		})
	}
}

func newBenchCluster(b *testing.B) *servertest.Cluster {
	return servertest.Start(b, 3, func(cfg *server.Config) { cfg.TickInterval = 50 * time.Millisecond })
}

// runCallers runs b.N calls of fn spread over callers goroutines and reports latency percentiles.
func runCallers(b *testing.B, callers int, fn func(context.Context) error) {
	var (
		mu   sync.Mutex
		lats []time.Duration
		next atomic.Int64
		wg   sync.WaitGroup
	)
	ctx := context.Background()
	b.ResetTimer()
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for next.Add(1) <= int64(b.N) {
				start := time.Now()
				if err := fn(ctx); err != nil {
					b.Error(err)
					return
				}
				mine = append(mine, time.Since(start))
			}
			mu.Lock()
			lats = append(lats, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	b.StopTimer()
	sort.Slice(lats, func(i, j int) bool { return lats[i] < lats[j] })
	if len(lats) > 0 {
		b.ReportMetric(float64(lats[len(lats)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(lats[len(lats)*99/100].Microseconds()), "p99-µs")
		b.ReportMetric(float64(len(lats))/b.Elapsed().Seconds(), "ops/s")
	}
}

// BenchmarkMassExpiry grants 100,000 leases whose deadlines fall at the same instant (a manual clock stands
// still while they are granted), moves the clock past it, and reports how long the leader takes to expire
// every one, and the worst latency of an unrelated client's acquires meanwhile.
// Run: go test -run '^$' -bench MassExpiry -benchtime 1x -timeout 20m ./server/
func BenchmarkMassExpiry(b *testing.B) {
	const n, ttl = 100_000, time.Second
	clock := server.NewManualClock()
	c := servertest.Start(b, 3, func(cfg *server.Config) {
		cfg.Clock = clock
		cfg.Limits.MaxLeasesPerHolder = n
	})
	leader := c.WaitLeader()
	cl := c.Leases(leader)
	ctx := context.Background()
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 256 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= n; i = next.Add(1) {
				if _, err := cl.Acquire(ctx, &leasepb.AcquireRequest{Resource: fmt.Sprintf("mass/%06d", i), Holder: "mass", TtlMs: ttl.Milliseconds()}); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	grantRate := float64(n) / time.Since(start).Seconds()
	b.ResetTimer()
	// Time passes normally (steps below the stall threshold, one tick each) up to the common deadline.
	node := c.Node(leader)
	step := func() {
		clock.Advance(20 * time.Millisecond)
		for from := node.Ticks(); node.Ticks() == from; {
			time.Sleep(time.Millisecond) // wait for the loop's next tick
		}
	}
	for elapsed := time.Duration(0); elapsed <= ttl; elapsed += 20 * time.Millisecond {
		step()
	}
	due := time.Now()
	probeDone := make(chan time.Duration)
	stop := make(chan struct{})
	go func() {
		var worst time.Duration
		for i := 0; ; i++ {
			select {
			case <-stop:
				probeDone <- worst
				return
			default:
			}
			t0 := time.Now()
			if _, err := cl.Acquire(ctx, &leasepb.AcquireRequest{Resource: fmt.Sprintf("probe/%d", i), Holder: "probe", TtlMs: 60_000}); err != nil {
				b.Error(err)
			}
			worst = max(worst, time.Since(t0))
		}
	}()
	for {
		list, err := cl.List(ctx, &leasepb.ListRequest{Prefix: "mass/", Limit: 1, Serializable: true})
		if err != nil {
			b.Fatal(err)
		}
		if len(list.GetLeases()) == 0 {
			break
		}
		// The clock goes on at about its real pace (the expiry rate is leases per second of it): a step
		// of 20 ms every 20 ms, or as slowly as the loop ticks.
		next := time.Now().Add(20 * time.Millisecond)
		step()
		time.Sleep(time.Until(next)) // the pace of the manual clock, not a wait for a condition
	}
	cleared := time.Since(due)
	close(stop)
	b.ReportMetric(cleared.Seconds(), "s-to-expire-all")
	b.ReportMetric(float64((<-probeDone).Milliseconds()), "worst-acquire-ms")
	b.ReportMetric(grantRate, "grants/s")
}
