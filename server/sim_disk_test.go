package server

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
)

// TestSimStalledDiskStopsTheNode: the leader's disk stops answering (one Save blocks for 5 s, longer
// than the 1 s disk stall timeout). The node gives up on it after the timeout — its Done closes with
// ErrDiskStalled naming the write and the file, the acquire waiting on it fails at once — while the other
// two elect a leader and keep serving: the leases, renewed by their holders through any node, are never
// lost on the survivors. Without the watchdog the stalled leader lingers until its write returns.
func TestSimStalledDiskStopsTheNode(t *testing.T) {
	const (
		ttl          = 2 * time.Second
		stallTimeout = time.Second
		stall        = 5 * time.Second
		leases       = 10
	)
	runSim(t, 3, func(cfg *Config) { cfg.DiskStallTimeout = stallTimeout }, func(t *testing.T, c *simCluster) {
		ctx := context.Background()
		l := c.waitLeader(10 * time.Second)
		refs := make([]*leasepb.LeaseRef, leases)
		for k := range refs {
			r := fmt.Sprintf("held/%d", k)
			resp, err := c.acquire(ctx, func(int) int { return l }, &leasepb.AcquireRequest{Resource: r, Holder: "h", TtlMs: ttl.Milliseconds(), RequestId: r})
			if err != nil {
				t.Fatal(err)
			}
			refs[k] = &leasepb.LeaseRef{Resource: r, Token: resp.GetLease().GetToken()}
		}
		survivors := []int{(l + 1) % 3, (l + 2) % 3}
		rctx, stopRenewing := context.WithCancel(ctx)
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			lost    []string
			renewed int
		)
		wg.Add(2)
		defer func() { // before the cluster closes, also when the test fails
			stopRenewing()
			wg.Wait()
		}()
		go func() { // the holders: a KeepAlive every 250 ms through a random node, as the SDK retries elsewhere
			defer wg.Done()
			rng := rand.New(rand.NewPCG(c.seed, 7))
			for rctx.Err() == nil {
				callCtx, cancel := context.WithTimeout(rctx, 200*time.Millisecond)
				_, err := c.node(rng.IntN(c.size())).ops.Write(callCtx, &wirepb.ForwardRequest{
					Request: &wirepb.ForwardRequest_KeepAlive{KeepAlive: &leasepb.KeepAliveRequest{Leases: refs}}})
				cancel()
				if err == nil {
					mu.Lock()
					renewed++
					mu.Unlock()
					time.Sleep(250 * time.Millisecond)
				}
			}
		}()
		go func() { // every tick, on the survivors: is every lease still held?
			defer wg.Done()
			for rctx.Err() == nil {
				for _, i := range survivors {
					for _, ref := range refs {
						if tok := c.holds(i, ref.Resource); tok != ref.Token && c.node(i).state.Applied() >= ref.Token {
							mu.Lock()
							lost = append(lost, fmt.Sprintf("%s on %s at %v", ref.Resource, c.cfgs[i].Name, time.Now().Format("15:04:05.000")))
							mu.Unlock()
						}
					}
				}
				time.Sleep(c.tick())
			}
		}()
		time.Sleep(ttl)

		watchEnded := make(chan error, 1)
		go func() { // a watcher on the node whose disk is about to stall
			watchEnded <- c.leases(l).Watch(&leasepb.WatchRequest{Prefix: "held/"}, &discardWatchStream{ctx: rctx})
		}()
		c.logs[l].Stall(stall)
		stalledAt := time.Now()
		type outcome struct {
			err error
			at  time.Time
		}
		waiting := make(chan outcome, 1)
		go func() { // a write on the stalled leader: its Save is the one that blocks
			_, err := c.leases(l).Acquire(ctx, &leasepb.AcquireRequest{Resource: "trigger", Holder: "h", TtlMs: 60_000, RequestId: "trigger"})
			waiting <- outcome{err, time.Now()}
		}()
		stopped := c.server(l).Done()
		c.waitFor(stall, "stop of the node with the stalled disk", func() bool {
			select {
			case <-stopped:
				return true
			default:
				return false
			}
		})
		took := time.Since(stalledAt)
		t.Logf("the stalled node stopped %v after its disk stalled: %v", took, c.server(l).Err())
		if took < stallTimeout || took > stallTimeout+stallTimeout/4+c.tick() {
			t.Fatalf("the stalled node stopped after %v, want just over the %v disk stall timeout", took, stallTimeout)
		}
		err := c.server(l).Err()
		if !errors.Is(err, ErrDiskStalled) || !strings.Contains(err.Error(), "save") || !strings.Contains(err.Error(), c.cfgs[l].DataDir) {
			t.Fatalf("node error %v: want ErrDiskStalled naming the write and the file %s", err, c.cfgs[l].DataDir)
		}
		select {
		case out := <-waiting:
			if status.Code(out.err) != codes.Unavailable || out.at.Sub(stalledAt) > took+c.tick() {
				t.Fatalf("the acquire waiting on the stalled node: %v after %v, want Unavailable when it stopped", out.err, out.at.Sub(stalledAt))
			}
		case <-time.After(c.tick()):
			t.Fatal("the acquire waiting on the stalled node was not failed when it stopped")
		}

		select {
		case err := <-watchEnded:
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("the watch on the stalled node ended with %v, want Unavailable", err)
			}
		case <-time.After(c.tick()):
			t.Fatal("the watch on the stalled node did not end when it stopped")
		}

		next := c.waitLeader(5 * time.Second)
		if next == l {
			t.Fatalf("the stalled node %d still counts as leader", l)
		}
		if _, err := c.acquire(ctx, func(a int) int { return survivors[a%2] }, &leasepb.AcquireRequest{
			Resource: "after", Holder: "h", TtlMs: 60_000, RequestId: "after"}); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		renewedBefore := renewed
		mu.Unlock()
		time.Sleep(3 * ttl)
		stopRenewing()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		if len(lost) > 0 {
			t.Fatalf("%d lease losses on the survivors, first: %v", len(lost), lost[:min(3, len(lost))])
		}
		if renewed == renewedBefore {
			t.Fatal("no renewal succeeded through the survivors")
		}
	})
}

// TestSimSlowDiskDoesNotStopTheNode: every write on every node takes a third of the disk stall timeout
// — a slow disk that makes progress. The watchdog bounds the age of one write, not throughput: no node
// stops, and writes keep being acknowledged.
func TestSimSlowDiskDoesNotStopTheNode(t *testing.T) {
	const stallTimeout = 2 * time.Second
	runSim(t, 3, func(cfg *Config) {
		cfg.TickInterval, cfg.ElectionTicks = 20*time.Millisecond, 50 // 1 s: slow writes cause no election
		cfg.DiskStallTimeout = stallTimeout
		cfg.ProposalTimeout = 10 * time.Second
	}, func(t *testing.T, c *simCluster) {
		l := c.waitLeader(20 * time.Second)
		saves := make([]int, c.size())
		for i := range c.size() {
			c.logs[i].Slow(stallTimeout / 3)
			saves[i] = c.logs[i].Saves()
		}
		start := time.Now()
		for k := range 10 {
			r := fmt.Sprintf("slow/%d", k)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // writes are slow
			_, err := c.leases(l).Acquire(ctx, &leasepb.AcquireRequest{Resource: r, Holder: "h", TtlMs: 60_000, RequestId: r})
			cancel()
			if err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("10 acquires on disks that take %v a write: %v", stallTimeout/3, time.Since(start))
		if c.leader() != l {
			t.Fatal("leadership moved: the slow writes were meant to stay below the election timeout")
		}
		for i := range c.size() {
			if err := c.server(i).Err(); err != nil {
				t.Fatalf("%s stopped on a slow disk: %v", c.cfgs[i].Name, err)
			}
			if n := c.logs[i].Saves() - saves[i]; n < 5 {
				t.Fatalf("%s made only %d slow writes", c.cfgs[i].Name, n)
			}
			c.logs[i].Slow(0)
		}
	})
}

// discardWatchStream is the server side of a Watch stream that drops what is sent.
type discardWatchStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *discardWatchStream) Context() context.Context          { return s.ctx }
func (s *discardWatchStream) Send(*leasepb.WatchResponse) error { return nil }
