package server_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest"
)

// BenchmarkAcquireDuringFlood measures one caller's acquire latency on the leader while it serves a
// flood at the default limits — 10,000 idle Watch streams (10 connections of 1,000), or 10,000 blocking
// acquires queued on 10 held resources — against the same cluster without one (docs/benchmarks.md):
//
//	go test -run '^$' -bench AcquireDuringFlood -benchtime 2000x ./server/
func BenchmarkAcquireDuringFlood(b *testing.B) {
	for _, flood := range []string{"none", "watchers", "waiters"} {
		b.Run("flood="+flood, func(b *testing.B) {
			// The production election timeout (1 s; newBenchCluster's is 500 ms): in-process, the flood's
			// clients share the two cores with all three nodes.
			c := servertest.Start(b, 3, func(cfg *server.Config) { cfg.TickInterval, cfg.ElectionTicks = 50*time.Millisecond, 20 })
			leader := c.WaitLeader()
			stop := startBenchFlood(b, c, leader, flood)
			defer stop()
			cl := c.Leases(leader)
			var seq atomic.Int64
			runCallers(b, 1, func(ctx context.Context) error {
				i := seq.Add(1)
				_, err := cl.Acquire(ctx, &leasepb.AcquireRequest{Resource: fmt.Sprintf("b/%d", i), Holder: "bench", TtlMs: 60_000})
				return err
			})
		})
	}
}

// startBenchFlood opens the flood on the leader and waits until all of it is served; the returned func
// ends it.
func startBenchFlood(b *testing.B, c *servertest.Cluster, leader int, kind string) func() {
	const conns, perConn = 10, 1000
	if kind == "none" {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	stop := func() {
		cancel()
		wg.Wait()
	}
	cl := c.Leases(leader)
	if kind == "waiters" {
		for r := range conns {
			if _, err := cl.Acquire(ctx, &leasepb.AcquireRequest{Resource: fmt.Sprintf("held/%d", r), Holder: "owner", TtlMs: 3_600_000}); err != nil {
				b.Fatal(err)
			}
		}
	}
	node := c.Node(leader)
	for k := range conns {
		conn, err := grpc.NewClient(c.Config(leader).ClientAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = conn.Close() })
		lc := leasepb.NewLeasesClient(conn)
		for i := range perConn {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if kind == "watchers" {
					if s, err := lc.Watch(ctx, &leasepb.WatchRequest{Prefix: "flood/"}); err == nil {
						_, _ = s.Recv()
					}
					return
				}
				_, err := lc.Acquire(ctx, &leasepb.AcquireRequest{Resource: fmt.Sprintf("held/%d", k), Holder: fmt.Sprintf("w%d-%d", k, i), TtlMs: 60_000, Wait: true})
				if err != nil && ctx.Err() == nil {
					b.Errorf("waiter: %v", err)
				}
			}()
		}
	}
	served := func() int {
		if kind == "watchers" {
			return node.Watchers()
		}
		return node.Waiters()
	}
	deadline := time.Now().Add(2 * time.Minute)
	for served() < conns*perConn {
		if time.Now().After(deadline) {
			stop()
			b.Fatalf("flood of %s: %d of %d served", kind, served(), conns*perConn)
		}
		time.Sleep(50 * time.Millisecond) // polling the node's counts
	}
	return stop
}
