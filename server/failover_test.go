package server_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest"
)

func TestLeaderLossWhileAcquiringKeepsTokensIncreasing(t *testing.T) {
	c := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	var (
		mu     sync.Mutex
		tokens []uint64
		wg     sync.WaitGroup
	)
	stop := make(chan struct{})
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := acquireRetrying(c, ctx, &leasepb.AcquireRequest{
					Resource: fmt.Sprintf("w%d/r%d", w, i), Holder: fmt.Sprintf("w%d", w), TtlMs: 5000, RequestId: fmt.Sprintf("w%d-%d", w, i)})
				if err != nil {
					t.Errorf("acquire: %v", err)
					return
				}
				mu.Lock()
				tokens = append(tokens, resp.GetLease().GetToken())
				mu.Unlock()
			}
		}()
	}
	eventually(t, 5*time.Second, "some grants", func() bool { mu.Lock(); defer mu.Unlock(); return len(tokens) > 20 })
	old := c.WaitLeader()
	killedAt := time.Now()
	c.Stop(old)
	newLeader := c.WaitLeader()
	t.Logf("new leader n%d after %v", newLeader+1, time.Since(killedAt))
	if time.Since(killedAt) > 5*c.Config(0).ElectionTimeout()+2*time.Second {
		t.Errorf("failover took %v", time.Since(killedAt))
	}
	// Enough grants under the new leader, then stop: the workers' 600 acquires need not all fit the
	// context's 10 s on a loaded machine.
	mu.Lock()
	atFailover := len(tokens)
	mu.Unlock()
	eventually(t, 8*time.Second, "grants under the new leader", func() bool { mu.Lock(); defer mu.Unlock(); return len(tokens) > atFailover+20 })
	close(stop)
	wg.Wait()
	seen := map[uint64]bool{}
	for _, tok := range tokens {
		if seen[tok] {
			t.Fatalf("token %d granted twice", tok)
		}
		seen[tok] = true
	}
	after, err := acquireRetrying(c, ctx, &leasepb.AcquireRequest{Resource: "after", Holder: "h", TtlMs: 5000, RequestId: "after"})
	if err != nil {
		t.Fatal(err)
	}
	for tok := range seen {
		if after.GetLease().GetToken() <= tok {
			t.Fatalf("token %d after failover is not above earlier token %d", after.GetLease().GetToken(), tok)
		}
	}
	c.Restart(old)
	c.WaitSettled()
}

func TestWholeClusterRestartKeepsLeases(t *testing.T) {
	c := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	var highest uint64
	for i := range 30 {
		resp, err := acquireRetrying(c, ctx, &leasepb.AcquireRequest{Resource: fmt.Sprintf("keep/%d", i), Holder: "h", TtlMs: 60_000, RequestId: fmt.Sprint(i)})
		if err != nil {
			t.Fatal(err)
		}
		highest = max(highest, resp.GetLease().GetToken())
	}
	for i := range c.Size() {
		c.Stop(i)
	}
	for i := range c.Size() {
		c.Restart(i)
	}
	c.WaitSettled()
	leader := c.WaitLeader()
	list, err := c.Leases(leader).List(ctx, &leasepb.ListRequest{Prefix: "keep/", Limit: 100})
	if err != nil || len(list.GetLeases()) != 30 {
		t.Fatalf("after restart: %d leases, %v", len(list.GetLeases()), err)
	}
	// The new leader counts every lease afresh from its takeover: (nearly) a full TTL again.
	for _, l := range list.GetLeases() {
		if l.GetRemainingMs() < 50_000 {
			t.Fatalf("%s has %d ms left after the restart, want close to its 60 s TTL", l.GetResource(), l.GetRemainingMs())
		}
	}
	resp, err := acquireRetrying(c, ctx, &leasepb.AcquireRequest{Resource: "new", Holder: "h", TtlMs: 5000, RequestId: "n"})
	if err != nil || resp.GetLease().GetToken() <= highest {
		t.Fatalf("new grant %v (%v) not above %d", resp, err, highest)
	}
}

func TestFollowerRestartedAfterCompactionCatchesUpBySnapshot(t *testing.T) {
	c := servertest.Start(t, 3, func(cfg *server.Config) { cfg.SnapshotEntries, cfg.SnapshotCatchUp = 50, 5 })
	ctx := ctxT(t)
	f := c.Follower()
	stoppedAt := stopBehind(t, c, f, "behind")
	for i := range 300 {
		if _, err := acquireRetrying(c, ctx, &leasepb.AcquireRequest{Resource: fmt.Sprintf("s/%d", i), Holder: "h", TtlMs: 60_000, RequestId: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	compactPast(t, c, stoppedAt, "fill")
	c.Restart(f)
	c.WaitSettled()
	if c.Node(f).SnapshotsRestored() == 0 {
		t.Fatal("the restarted follower caught up without a snapshot: the log was not compacted past it")
	}
	resp, err := c.Leases(f).List(ctx, &leasepb.ListRequest{Prefix: "s/", Limit: 1000, Serializable: true})
	if err != nil || len(resp.GetLeases()) != 300 {
		t.Fatalf("restarted follower sees %d leases (%v), want 300", len(resp.GetLeases()), err)
	}
}

func TestBlockingAcquireIsServedInFIFOOrder(t *testing.T) {
	c := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	holder, err := acquireRetrying(c, ctx, &leasepb.AcquireRequest{Resource: "q", Holder: "first", TtlMs: 60_000, RequestId: "first"})
	if err != nil {
		t.Fatal(err)
	}
	leader := c.WaitLeader()
	order := make(chan string, 3)
	var wg sync.WaitGroup
	for i, name := range []string{"w1", "w2", "w3"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := c.Leases((leader+i)%3).Acquire(ctx, &leasepb.AcquireRequest{Resource: "q", Holder: name, TtlMs: 60_000, RequestId: name, Wait: true})
			if err != nil {
				t.Errorf("%s: %v", name, err)
				return
			}
			order <- name
			if _, err := c.Leases(leader).Release(ctx, &leasepb.ReleaseRequest{Resource: "q", Token: resp.GetLease().GetToken()}); err != nil {
				t.Errorf("release %s: %v", name, err)
			}
		}()
		// Queue them one after another.
		eventually(t, 5*time.Second, name+" queued", func() bool { return c.Node(leader).QueueLen("q") == i+1 })
	}
	// A cancelled waiter leaves the queue.
	cctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Leases(leader).Acquire(cctx, &leasepb.AcquireRequest{Resource: "q", Holder: "quitter", TtlMs: 1000, RequestId: "x", Wait: true})
		errc <- err
	}()
	eventually(t, 5*time.Second, "quitter queued", func() bool { return c.Node(leader).QueueLen("q") == 4 })
	cancel()
	if err := <-errc; code(err) != codes.Canceled {
		t.Fatalf("cancelled waiter: %v", err)
	}
	eventually(t, 5*time.Second, "quitter gone", func() bool { return c.Node(leader).QueueLen("q") == 3 })
	if _, err := c.Leases(leader).Release(ctx, &leasepb.ReleaseRequest{Resource: "q", Token: holder.GetLease().GetToken()}); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(order)
	var got []string
	for name := range order {
		got = append(got, name)
	}
	if fmt.Sprint(got) != "[w1 w2 w3]" {
		t.Fatalf("served in order %v, want [w1 w2 w3]", got)
	}
}

func TestWatchDeliversEventsInOrderAndResumes(t *testing.T) {
	c := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.Leases(1).Watch(wctx, &leasepb.WatchRequest{Prefix: "w/"})
	if err != nil {
		t.Fatal(err)
	}
	// The stream is registered once the first response could arrive; make sure with a marker event.
	var toks []uint64
	for i := range 5 {
		resp, err := acquireRetrying(c, ctx, &leasepb.AcquireRequest{Resource: fmt.Sprintf("w/%d", i), Holder: "h", TtlMs: 60_000, RequestId: fmt.Sprint(i)})
		if err != nil {
			t.Fatal(err)
		}
		toks = append(toks, resp.GetLease().GetToken())
	}
	if _, err := c.Leases(0).Release(ctx, &leasepb.ReleaseRequest{Resource: "w/0", Token: toks[0]}); err != nil {
		t.Fatal(err)
	}
	if _, err := acquireRetrying(c, ctx, &leasepb.AcquireRequest{Resource: "other", Holder: "h", TtlMs: 60_000, RequestId: "o"}); err != nil {
		t.Fatal(err)
	}
	events := recvEvents(t, stream, 6)
	var last uint64
	for i, e := range events {
		if e.GetIndex() <= last {
			t.Fatalf("event %d index %d not after %d", i, e.GetIndex(), last)
		}
		last = e.GetIndex()
		if e.GetLease().GetResource() == "other" {
			t.Fatal("prefix filter let another resource through")
		}
	}
	if events[5].GetType() != leasepb.EventType_EVENT_TYPE_RELEASED || events[0].GetLease().GetToken() != toks[0] {
		t.Fatalf("events = %v", events)
	}
	// Resume from the third event's index on another node.
	resumed, err := c.Leases(2).Watch(wctx, &leasepb.WatchRequest{Prefix: "w/", FromIndex: events[2].GetIndex()})
	if err != nil {
		t.Fatal(err)
	}
	again := recvEvents(t, resumed, 4)
	for i := range again {
		if again[i].GetIndex() != events[i+2].GetIndex() {
			t.Fatalf("resumed event %d has index %d, want %d", i, again[i].GetIndex(), events[i+2].GetIndex())
		}
	}
}

func recvEvents(t *testing.T, stream leasepb.Leases_WatchClient, n int) []*leasepb.Event {
	t.Helper()
	var out []*leasepb.Event
	for len(out) < n {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("watch recv after %d events: %v", len(out), err)
		}
		out = append(out, resp.GetEvents()...)
	}
	return out
}

func TestStallDetectedByTheReadyLoopExtendsDeadlines(t *testing.T) {
	clock := server.NewManualClock()
	c := servertest.Start(t, 1, func(cfg *server.Config) { cfg.Clock = clock })
	ctx := ctxT(t)
	n := c.Node(0)
	if _, err := c.Leases(0).Acquire(ctx, &leasepb.AcquireRequest{Resource: "s", Holder: "h", TtlMs: 1000, RequestId: "s"}); err != nil {
		t.Fatal(err)
	}
	waitTicks := func(k uint64) {
		from := n.Ticks()
		eventually(t, 5*time.Second, "ticks", func() bool { return n.Ticks() >= from+k })
	}
	// The loop "stalls" for 10s: the next tick sees the gap and extends every deadline by it.
	clock.Advance(10 * time.Second)
	waitTicks(5)
	if _, err := c.Leases(0).Get(ctx, &leasepb.GetRequest{Resource: "s"}); err != nil {
		t.Fatalf("lease expired after a stall: %v", err)
	}
	// Time then passes normally, in steps shorter than the stall threshold: the lease expires.
	for range 60 {
		clock.Advance(20 * time.Millisecond)
		waitTicks(1)
	}
	eventually(t, 5*time.Second, "expiry after the TTL", func() bool {
		_, err := c.Leases(0).Get(ctx, &leasepb.GetRequest{Resource: "s"})
		return code(err) == codes.NotFound
	})
}
