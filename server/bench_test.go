package server_test

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
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
	m := startMass(b, n, ttl, func(*server.Config) {})
	b.ResetTimer()
	for elapsed := time.Duration(0); elapsed <= ttl; elapsed += 20 * time.Millisecond {
		m.step()
	}
	due := time.Now()
	worst := m.probe(b)
	m.runUntil(b, func() bool {
		list, err := m.leases.List(context.Background(), &leasepb.ListRequest{Prefix: "mass/", Limit: 1, Serializable: true})
		if err != nil {
			b.Fatal(err)
		}
		return len(list.GetLeases()) == 0
	})
	b.ReportMetric(time.Since(due).Seconds(), "s-to-expire-all")
	b.ReportMetric(float64(worst().Milliseconds()), "worst-acquire-ms")
	b.ReportMetric(m.grantRate, "grants/s")
}

// BenchmarkMassCheckpoint: the idle checkpoints of a mass disconnect. It grants 100,000 leases (or
// LEASED_BENCH_LEASES) under a 60 s TTL at one instant of a manual clock (their holders then renew none),
// with the production checkpoint interval, snapshot spacing and election timeout (in 10 ms ticks), and
// moves the clock on at about its real pace until a follower has applied an idle checkpoint to every one
// of 200 leases spread over them, then one second more. It reports how long the checkpoints took to
// apply, from the first of those 200 to the last, and the worst latency of an unrelated client's acquires
// meanwhile. LEASED_BENCH_CPUPROFILE=path writes a CPU profile of the storm (after the leases are
// granted).
// Run: go test -run '^$' -bench MassCheckpoint -benchtime 1x -timeout 20m ./server/
func BenchmarkMassCheckpoint(b *testing.B) {
	const samples = 200
	n := benchLeases(b, 100_000)
	prod := server.DefaultConfig()
	m := startMass(b, n, time.Minute, func(cfg *server.Config) {
		cfg.CheckpointInterval = prod.CheckpointInterval
		cfg.SnapshotEntries, cfg.SnapshotCatchUp = prod.SnapshotEntries, prod.SnapshotCatchUp
		cfg.ElectionTicks = int(prod.ElectionTimeout() / cfg.TickInterval)
	})
	follower := m.c.Node(m.c.Follower())
	var sampled []string
	for i := 1; i <= n; i += n / samples {
		sampled = append(sampled, fmt.Sprintf("mass/%06d", i))
	}
	b.ResetTimer()
	defer profileCPU(b, os.Getenv("LEASED_BENCH_CPUPROFILE"))()
	var first, last time.Time
	worst := m.probe(b)
	m.runUntil(b, func() bool {
		done := follower.CheckpointedAmong(sampled)
		if done > 0 && first.IsZero() {
			first = time.Now()
		}
		return done == len(sampled)
	})
	last = time.Now()
	for range 50 {
		m.step()
	}
	b.ReportMetric(last.Sub(first).Seconds(), "s-checkpointing")
	b.ReportMetric(float64(worst().Milliseconds()), "worst-acquire-ms")
	b.ReportMetric(m.grantRate, "grants/s")
}

// mass is a 3-node cluster on a manual clock holding n leases named mass/NNNNNN, all granted at one
// instant of that clock, for the mass benchmarks.
type mass struct {
	c         *servertest.Cluster
	clock     *server.ManualClock
	leader    *server.Server
	leases    leasepb.LeasesClient
	grantRate float64
}

func startMass(b *testing.B, n int, ttl time.Duration, configure func(*server.Config)) *mass {
	clock := server.NewManualClock()
	c := servertest.Start(b, 3, func(cfg *server.Config) {
		cfg.Clock = clock
		cfg.Limits.MaxLeasesPerHolder = n
		cfg.Limits.MaxLeases = n + 100_000 // room for the probe's
		cfg.Limits.QuotaBytes = 8 << 30
		configure(cfg)
	})
	leader := c.WaitLeader()
	m := &mass{c: c, clock: clock, leader: c.Node(leader), leases: c.Leases(leader)}
	start := time.Now()
	acquireMany(b, m.leases, n, func(i int) *leasepb.AcquireRequest {
		return &leasepb.AcquireRequest{Resource: fmt.Sprintf("mass/%06d", i), Holder: "mass", TtlMs: ttl.Milliseconds()}
	})
	m.grantRate = float64(n) / time.Since(start).Seconds()
	return m
}

// step moves the clock 20 ms on (below the stall threshold) and waits for the leader's next tick.
func (m *mass) step() {
	m.clock.Advance(20 * time.Millisecond)
	for from := m.leader.Ticks(); m.leader.Ticks() == from; {
		time.Sleep(time.Millisecond) // wait for the loop's next tick
	}
}

// runUntil moves the clock on at about its real pace (the expiry rate is leases per second of it): a
// step of 20 ms every 20 ms, or as slowly as the loop ticks, until done.
func (m *mass) runUntil(b *testing.B, done func() bool) {
	for !done() {
		next := time.Now().Add(20 * time.Millisecond)
		m.step()
		time.Sleep(time.Until(next)) // the pace of the manual clock, not a wait for a condition
	}
}

// probe starts acquiring unrelated leases one after another; the function it returns stops it and says
// the worst latency seen.
func (m *mass) probe(b *testing.B) (stop func() time.Duration) {
	done := make(chan struct{})
	worst := make(chan time.Duration)
	go func() {
		var w time.Duration
		for i := 0; ; i++ {
			select {
			case <-done:
				worst <- w
				return
			default:
			}
			t0 := time.Now()
			if _, err := m.leases.Acquire(context.Background(), &leasepb.AcquireRequest{Resource: fmt.Sprintf("probe/%d", i), Holder: "probe", TtlMs: 60_000}); err != nil {
				b.Error(err)
			}
			w = max(w, time.Since(t0))
		}
	}()
	return func() time.Duration {
		close(done)
		return <-worst
	}
}

// profileCPU starts a CPU profile into path (nothing if path is empty) and returns what stops it.
func profileCPU(b *testing.B, path string) (stop func()) {
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			b.Error(err)
		}
	}
}
