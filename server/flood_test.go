package server_test

import (
	"context"
	"fmt"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest"
)

// Floods at the sizes the limits are documented for (10,000 watch calls, 10,000 waiters, 1,000 streams) against the leader
// of a real three-node cluster on loopback, with small limits so that most of each flood is refused: the
// refusals are ResourceExhausted naming the limit's flag, the leader keeps its leadership (same leader,
// same term, no leader change anywhere), and its heap stays bounded. The cluster runs with the production
// election timeout (1 s): the point is that a flood cannot stall the leader's loop, not that a loaded
// test machine never does. The heap bounds are generous (the client side of each flood lives in the same
// process); the probe that found the problem took a leader from 23 MB to 2 GB with 4,000 watches.

// flood is a three-node cluster under a flood, with each node's metrics.
type flood struct {
	t       *testing.T
	c       *servertest.Cluster
	regs    map[string]*prometheus.Registry
	leader  int
	term    float64
	changes float64
	heap    uint64
}

func startFlood(t *testing.T, limits func(*server.Limits)) *flood {
	f := &flood{t: t, regs: map[string]*prometheus.Registry{}}
	var mu sync.Mutex
	f.c = servertest.Start(t, 3, func(cfg *server.Config) {
		cfg.ElectionTicks = 100 // 1 s, as in production
		cfg.ProposalTimeout = 10 * time.Second
		limits(&cfg.Limits)
		reg := prometheus.NewRegistry()
		mu.Lock()
		f.regs[cfg.Name] = reg
		mu.Unlock()
		cfg.Registerer = reg
	})
	f.leader = f.c.WaitLeader()
	f.term, f.changes = f.metric(f.leader, "leased_term"), f.leaderChanges()
	f.heap = heapBytes()
	return f
}

func (f *flood) metric(i int, name string) float64 {
	return gather(f.t, f.regs[f.c.Config(i).Name]).value(name)
}

func (f *flood) leaderChanges() float64 {
	var sum float64
	for i := range f.c.Size() {
		sum += f.metric(i, "leased_leader_changes_total")
	}
	return sum
}

// check asserts that the leader kept its leadership and that the heap grew by at most maxGrowth.
func (f *flood) check(maxGrowth uint64) {
	f.t.Helper()
	if !f.c.Node(f.leader).IsLeader() {
		f.t.Errorf("node %d lost leadership during the flood", f.leader)
	}
	if term := f.metric(f.leader, "leased_term"); term != f.term {
		f.t.Errorf("term moved from %v to %v during the flood", f.term, term)
	}
	if changes := f.leaderChanges(); changes != f.changes {
		f.t.Errorf("leased_leader_changes_total moved from %v to %v during the flood", f.changes, changes)
	}
	heap := heapBytes()
	f.t.Logf("live heap %d MiB before the flood, %d MiB during it", f.heap>>20, heap>>20)
	if heap > f.heap+maxGrowth {
		f.t.Errorf("live heap grew from %d MiB to %d MiB, the bound is %d MiB more", f.heap>>20, heap>>20, maxGrowth>>20)
	}
}

// conns dials n separate connections (n gRPC transports) to the leader.
func (f *flood) conns(n int) []*grpc.ClientConn {
	out := make([]*grpc.ClientConn, n)
	for i := range out {
		conn, err := grpc.NewClient(f.c.Config(f.leader).ClientAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			f.t.Fatal(err)
		}
		f.t.Cleanup(func() { _ = conn.Close() })
		out[i] = conn
	}
	return out
}

// floodCtx bounds a flood's calls (their ends are awaited by the test itself).
func floodCtx(t *testing.T) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx, cancel
}

// heapBytes is the live heap after a collection (runtime/metrics).
func heapBytes() uint64 {
	runtime.GC()
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// refusals counts the ResourceExhausted answers of a flood by the flag their QuotaFailure names; any
// other error is recorded as such.
type refusals struct {
	mu     sync.Mutex
	byFlag map[string]int
	other  []error
	total  atomic.Int64
}

func (r *refusals) add(err error) {
	st := status.Convert(err)
	flag := ""
	for _, d := range st.Details() {
		if q, ok := d.(*errdetails.QuotaFailure); ok && len(q.GetViolations()) > 0 {
			flag = q.GetViolations()[0].GetSubject()
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byFlag == nil {
		r.byFlag = map[string]int{}
	}
	if st.Code() == codes.ResourceExhausted && flag != "" {
		r.byFlag[flag]++
		r.total.Add(1)
	} else if st.Code() != codes.Canceled {
		r.other = append(r.other, err)
	}
}

// describe says how many calls were refused at a limit and how many failed otherwise.
func (r *refusals) describe() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	first := error(nil)
	if len(r.other) > 0 {
		first = r.other[0]
	}
	return fmt.Sprintf("%d refused at a limit %v, %d failed otherwise (first: %v)", r.total.Load(), r.byFlag, len(r.other), first)
}

func (r *refusals) check(t *testing.T, want int, flags ...string) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.other) > 0 {
		t.Fatalf("%d calls failed otherwise than a limit refusal, first: %v", len(r.other), r.other[0])
	}
	sum := 0
	for flag, n := range r.byFlag {
		known := false
		for _, f := range flags {
			known = known || f == flag
		}
		if !known {
			t.Errorf("%d refusals name %q, want one of %v", n, flag, flags)
		}
		sum += n
	}
	if sum != want {
		t.Errorf("%d refusals (%v), want %d", sum, r.byFlag, want)
	}
	t.Logf("refusals by flag: %v", r.byFlag)
}

// TestWatchFloodIsRefusedPastTheLimits: 10,000 Watch calls over 10 connections against a leader that
// serves at most 2,000 watchers (500 per connection): exactly 2,000 are served, the other 8,000 refused
// naming --max-watchers or --max-watchers-per-conn, while acquires go on and the watchers get their
// events. Then one connection's 600 watches: 500 served, 100 refused naming --max-watchers-per-conn.
func TestWatchFloodIsRefusedPastTheLimits(t *testing.T) {
	const (
		calls, conns = 10_000, 10
		perNode      = 2000
		perConn      = 500
	)
	f := startFlood(t, func(l *server.Limits) {
		l.MaxWatchers, l.MaxWatchersPerConn, l.MaxStreamsPerConn = perNode, perConn, 100_000
	})
	ctx, cancel := floodCtx(t)
	var (
		wg       sync.WaitGroup
		refused  refusals
		received atomic.Int64
	)
	defer func() {
		cancel()
		wg.Wait()
	}()
	cs := f.conns(conns)
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stream, err := leasepb.NewLeasesClient(cs[i%conns]).Watch(ctx, &leasepb.WatchRequest{Prefix: "flood/"})
			if err != nil {
				refused.add(err)
				return
			}
			for {
				resp, err := stream.Recv()
				if err != nil {
					refused.add(err)
					return
				}
				received.Add(int64(len(resp.GetEvents())))
			}
		}()
	}
	leader := f.c.Node(f.leader)
	eventually(t, 60*time.Second, "the flood to be served or refused", func() bool {
		return refused.total.Load() == calls-perNode && leader.Watchers() == perNode
	})
	// The served watchers see the events of acquires made meanwhile.
	leases := f.c.Leases(f.leader)
	for i := range 20 {
		if _, err := leases.Acquire(ctx, &leasepb.AcquireRequest{Resource: fmt.Sprintf("flood/%d", i), Holder: "h", TtlMs: 60_000}); err != nil {
			t.Fatalf("acquire during the flood: %v", err)
		}
	}
	eventually(t, 60*time.Second, "every served watcher to see the 20 grants", func() bool { return received.Load() == 20*perNode })
	f.check(256 << 20)
	refused.check(t, calls-perNode, "--max-watchers", "--max-watchers-per-conn")
	cancel()
	wg.Wait()
	eventually(t, 10*time.Second, "the watchers to end", func() bool { return leader.Watchers() == 0 })

	// One connection: its limit refuses past 500.
	ctx, cancel = floodCtx(t)
	var one refusals
	conn := f.conns(1)[0]
	for range perConn + 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stream, err := leasepb.NewLeasesClient(conn).Watch(ctx, &leasepb.WatchRequest{Prefix: "one/"})
			if err == nil {
				_, err = stream.Recv()
			}
			one.add(err)
		}()
	}
	eventually(t, 30*time.Second, "one connection's watches", func() bool { return one.total.Load() == 100 && leader.Watchers() == perConn })
	one.check(t, 100, "--max-watchers-per-conn")
}

// TestWaiterFloodIsRefusedPastTheLimits: 10,000 blocking acquires of held resources over 10 connections
// (half of them on one resource) against a leader that queues at most 2,000 (500 per resource): exactly
// 2,000 wait, the other 8,000 are refused naming --max-waiters or --max-waiters-per-resource, without a
// log entry each, and a waiter still gets its resource when the holder releases it.
func TestWaiterFloodIsRefusedPastTheLimits(t *testing.T) {
	const (
		calls, conns = 10_000, 10
		perNode      = 2000
		perResource  = 500
		resources    = 20
	)
	f := startFlood(t, func(l *server.Limits) {
		l.MaxWaiters, l.MaxWaitersPerResource, l.MaxStreamsPerConn = perNode, perResource, 100_000
	})
	ctx, cancel := floodCtx(t)
	var (
		wg      sync.WaitGroup
		refused refusals
		granted atomic.Int64
	)
	defer func() {
		cancel()
		wg.Wait()
	}()
	leases := f.c.Leases(f.leader)
	held := make([]*leasepb.Lease, resources)
	for r := range held {
		// Ten minutes: no holder's lease may expire (and grant its waiters) however slowly a loaded
		// machine takes the flood in; at 60 s it could, just as the wait below gave up.
		resp, err := leases.Acquire(ctx, &leasepb.AcquireRequest{Resource: fmt.Sprintf("wait/%d", r), Holder: "owner", TtlMs: 600_000})
		if err != nil {
			t.Fatal(err)
		}
		held[r] = resp.GetLease()
	}
	applied := f.c.Node(f.leader).AppliedIndex()
	cs := f.conns(conns)
	for i := range calls {
		r := 0 // half on wait/0, the rest spread over the others
		if i%2 == 1 {
			r = 1 + i%(resources-1)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// i/2 rather than i: both halves use every connection (with i%conns, wait/0's calls all went
			// over the even connections, and when those started late no call for wait/0 was queued).
			_, err := leasepb.NewLeasesClient(cs[(i/2)%conns]).Acquire(ctx, &leasepb.AcquireRequest{
				Resource: fmt.Sprintf("wait/%d", r), Holder: fmt.Sprintf("w%d", i), TtlMs: 60_000, Wait: true})
			if err == nil {
				granted.Add(1)
				return
			}
			refused.add(err)
		}()
	}
	leader := f.c.Node(f.leader)
	defer func() {
		if t.Failed() { // say where the flood stood (a CI run once timed out below with nothing to go on)
			t.Logf("%s; %d waiting on the leader; %v leader changes", refused.describe(), leader.Waiters(), f.leaderChanges()-f.changes)
		}
	}()
	eventually(t, 100*time.Second, "the flood to be queued or refused", func() bool { // within floodCtx's 2 min
		return refused.total.Load() == calls-perNode && leader.Waiters() == perNode
	})
	q := leader.QueueLen("wait/0")
	if q > perResource {
		t.Errorf("%d waiters queued for wait/0, the limit is %d", q, perResource)
	}
	t.Logf("%d waiters queued for wait/0", q)
	// Neither the waiters (their resources are held) nor the refusals wrote anything; a few entries are
	// the lessor's checkpoints.
	if grew := leader.AppliedIndex() - applied; grew > 10 {
		t.Errorf("the log grew by %d entries during the flood", grew)
	}
	f.check(256 << 20)
	refused.check(t, calls-perNode, "--max-waiters", "--max-waiters-per-resource")
	// The resource released is one with waiters: which resources got them depends on the order the calls
	// arrived in.
	busiest := held[0]
	for _, l := range held {
		if leader.QueueLen(l.GetResource()) > leader.QueueLen(busiest.GetResource()) {
			busiest = l
		}
	}
	if _, err := leases.Release(ctx, &leasepb.ReleaseRequest{Resource: busiest.GetResource(), Token: busiest.GetToken()}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "a waiter to get the released resource", func() bool { return granted.Load() == 1 })
}

// TestStreamFloodOnOneConnectionIsRefusedPastTheLimit: 1,000 KeepAlive streams on one connection whose
// limit is 100: 100 are open, 900 refused naming --max-streams-per-conn, and so is a unary call on that
// connection while it is full; another connection is served as usual.
func TestStreamFloodOnOneConnectionIsRefusedPastTheLimit(t *testing.T) {
	const (
		calls   = 1000
		perConn = 100
	)
	f := startFlood(t, func(l *server.Limits) { l.MaxStreamsPerConn = perConn })
	ctx, cancel := floodCtx(t)
	var (
		wg      sync.WaitGroup
		refused refusals
		open    atomic.Int64
	)
	defer func() {
		cancel()
		wg.Wait()
	}()
	conns := f.conns(2)
	full := leasepb.NewLeasesClient(conns[0])
	for range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stream, err := full.KeepAlive(ctx)
			if err == nil {
				// A first message, answered once the stream is served: an empty batch renews nothing.
				if err = stream.Send(&leasepb.KeepAliveRequest{Seq: 1}); err == nil {
					if _, err = stream.Recv(); err == nil {
						open.Add(1)
						_, err = stream.Recv() // held open until the test ends
					}
				}
			}
			refused.add(err)
		}()
	}
	eventually(t, 60*time.Second, "the streams to be served or refused", func() bool {
		return refused.total.Load() == calls-perConn && open.Load() == perConn
	})
	_, err := full.Get(ctx, &leasepb.GetRequest{Resource: "x"})
	refused.add(err)
	refused.check(t, calls-perConn+1, "--max-streams-per-conn")
	if _, err := leasepb.NewLeasesClient(conns[1]).Acquire(ctx, &leasepb.AcquireRequest{Resource: "s", Holder: "h", TtlMs: 60_000}); err != nil {
		t.Fatalf("acquire on another connection: %v", err)
	}
	f.check(128 << 20)
}
