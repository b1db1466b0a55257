package client_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/leased/leased/client"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest"
)

// BenchmarkKeepAlive10kLeases holds 10,000 leases (TTL 10s) in one client against an in-process 3-node
// cluster (with the production checkpoint interval, 5s) and reports the CPU the whole process (client and
// the three servers) spends keeping them alive.
// Run: go test -run '^$' -bench KeepAlive10k -benchtime 1x ./client/
func BenchmarkKeepAlive10kLeases(b *testing.B) {
	const n, ttl, window = 10_000, 10 * time.Second, 20 * time.Second
	cl := servertest.Start(b, 3, func(cfg *server.Config) { cfg.CheckpointInterval = server.DefaultConfig().CheckpointInterval })
	c, err := client.New(client.Config{Endpoints: cl.Endpoints(), Holder: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	leases := make([]*client.Lease, n)
	var wg sync.WaitGroup
	for w := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 64 {
				l, err := c.Acquire(ctx, fmt.Sprintf("ka/%05d", i), client.WithTTL(ttl))
				if err != nil {
					b.Error(err)
					return
				}
				leases[i] = l
			}
		}()
	}
	wg.Wait()
	b.ResetTimer()
	for range b.N {
		before := cpuTime()
		start := time.Now()
		time.Sleep(window) // the measurement window: renewals happen every TTL/3 meanwhile
		used := cpuTime() - before
		b.ReportMetric(float64(used)/float64(time.Since(start))*100, "cpu-%")
		b.ReportMetric(float64(used.Milliseconds())/(window.Seconds()/(ttl.Seconds()/3)), "cpu-ms/round")
	}
	for _, l := range leases {
		if l != nil && l.Err() != nil {
			b.Fatalf("lease %s lost: %v", l.Resource(), l.Err())
		}
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkContendedHandoffSDK is server.BenchmarkContendedHandoff through the SDK: 16 clients (one
// client.Client each) loop Acquire WithWait, then Release, on one resource of an in-process 3-node cluster.
// Run: go test -run '^$' -bench ContendedHandoffSDK -benchtime 1000x -count 3 ./client/
func BenchmarkContendedHandoffSDK(b *testing.B) {
	const clients = 16
	cl := servertest.Start(b, 3, func(cfg *server.Config) { cfg.TickInterval = 50 * time.Millisecond })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute) // bounds the loop
	defer cancel()
	sdks := make([]*client.Client, clients)
	for i := range sdks {
		c, err := client.New(client.Config{Endpoints: cl.Endpoints(), Holder: fmt.Sprintf("h%d", i)})
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		sdks[i] = c
	}
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	b.ResetTimer()
	for _, c := range sdks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				l, err := c.Acquire(ctx, "contended", client.WithWait(), client.WithTTL(time.Minute))
				if err != nil {
					b.Error(err)
					return
				}
				if err := l.Release(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "handoffs/s")
}
