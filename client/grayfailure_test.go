package client_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/client"
	"github.com/leased/leased/server/servertest"
)

// Gray failures (issue #11): nodes and links that accept connections and then never answer.

// frozenNode listens on loopback, accepts every connection and never sends a byte: a SIGSTOPped process,
// as far as a client can tell (its kernel still completes the TCP handshake).
func frozenNode(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Go(func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		_ = lis.Close()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return lis.Addr().String()
}

// blackHole dials through net.Dialer; once an address is black-holed, every connection to it (open or
// new) silently swallows what is written and never delivers another byte, while staying open.
type blackHole struct {
	mu    sync.Mutex
	holed map[string]bool
	conns map[string][]*holeConn
}

func newBlackHole() *blackHole {
	return &blackHole{holed: map[string]bool{}, conns: map[string][]*holeConn{}}
}

func (b *blackHole) dialOption() grpc.DialOption { return grpc.WithContextDialer(b.dial) }

func (b *blackHole) dial(ctx context.Context, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	hc := &holeConn{Conn: conn, closed: make(chan struct{})}
	hc.holed.Store(b.holed[addr])
	b.conns[addr] = append(b.conns[addr], hc)
	return hc, nil
}

func (b *blackHole) hole(addr string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.holed[addr] = true
	for _, c := range b.conns[addr] {
		c.holed.Store(true)
	}
}

type holeConn struct {
	net.Conn
	holed     atomic.Bool
	closeOnce sync.Once
	closed    chan struct{}
}

func (c *holeConn) Read(p []byte) (int, error) {
	for {
		if c.holed.Load() {
			<-c.closed
			return 0, net.ErrClosed
		}
		n, err := c.Conn.Read(p)
		if err != nil || !c.holed.Load() {
			return n, err
		}
		// Black-holed while this read was in flight: the bytes never arrived.
	}
}

func (c *holeConn) Write(p []byte) (int, error) {
	if c.holed.Load() {
		return len(p), nil
	}
	return c.Conn.Write(p)
}

func (c *holeConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// TestAcquireWithAFrozenFirstEndpointAnswersQuickly is issue #11 (b): with the first endpoint frozen,
// Acquire through the SDK with its default config answers within 2s (it used to wait out its whole
// deadline on the frozen node), and a second call does not go back to the frozen node.
func TestAcquireWithAFrozenFirstEndpointAnswersQuickly(t *testing.T) {
	cl := servertest.Start(t, 3, nil)
	frozen := frozenNode(t)
	c := newClient(t, append([]string{frozen}, cl.Endpoints()...), nil)
	ctx := ctxT(t)
	for _, resource := range []string{"gray/first", "gray/second"} {
		start := time.Now()
		l, err := c.Acquire(ctx, resource, client.WithTTL(10*time.Second))
		took := time.Since(start)
		if err != nil {
			t.Fatalf("acquire %s after %v: %v", resource, took, err)
		}
		t.Logf("acquire %s answered in %v", resource, took)
		if took > 2*time.Second {
			t.Fatalf("acquire %s took %v with a frozen first endpoint, want < 2s", resource, took)
		}
		_ = l.Release(ctx)
	}
}

// TestCallMovesOnFromANodeThatNeverAnswers: every endpoint but the last accepts connections and never
// answers; a call still gets its answer within its deadline, because each attempt has its own share.
func TestCallMovesOnFromANodeThatNeverAnswers(t *testing.T) {
	cl := servertest.Start(t, 1, nil)
	eps := []string{frozenNode(t), frozenNode(t), cl.Endpoints()[0]}
	c := newClient(t, eps, func(cfg *client.Config) { cfg.RequestTimeout = 3 * time.Second })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := c.Acquire(ctx, "gray/last", client.WithTTL(10*time.Second)); err != nil {
		t.Fatalf("acquire after %v: %v", time.Since(start), err)
	}
	t.Logf("answered in %v", time.Since(start))
}

// TestKeepAliveLeavesABlackHoledLeader is issue #11 (a): the link to the leader black-holes (the leader
// itself stays healthy, so no election happens); the keeper's watchdog abandons the unanswered stream and
// renews through another node, and the lease survives several TTLs. It used to stay on the dead stream
// until the lease was lost.
func TestKeepAliveLeavesABlackHoledLeader(t *testing.T) {
	cl := servertest.Start(t, 3, nil)
	leader := cl.Endpoints()[cl.WaitLeader()]
	bh := newBlackHole()
	c := newClient(t, cl.Endpoints(), func(cfg *client.Config) {
		cfg.DialOptions = []grpc.DialOption{bh.dialOption()}
	})
	ctx := ctxT(t)
	const ttl = 1500 * time.Millisecond
	l, err := c.Acquire(ctx, "gray/keeper", client.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	// Wait until the keeper's stream is on the leader and has renewed once (the end of the validity
	// window moved by most of a renewal interval).
	firstEnd := time.Now().Add(l.Remaining())
	for deadline := time.Now().Add(5 * time.Second); !time.Now().Add(l.Remaining()).After(firstEnd.Add(ttl / 6)); {
		if time.Now().After(deadline) {
			t.Fatal("no renewal succeeded within 5s")
		}
		time.Sleep(5 * time.Millisecond) // poll interval
	}
	bh.hole(leader)
	holedAt := time.Now()
	end := holedAt.Add(3 * ttl)
	for time.Now().Before(end) {
		select {
		case <-l.Done():
			t.Fatalf("lease lost %v after the link to the leader black-holed: %v", time.Since(holedAt), l.Err())
		case <-time.After(50 * time.Millisecond): // observation interval
		}
	}
}

// stuckLeader is a node that says it leads and then never answers an Acquire: a leader whose disk or
// loop stalled after the connection and the Status answer.
type stuckLeader struct {
	leasepb.UnimplementedLeasesServer
	leasepb.UnimplementedClusterServer
	acquires atomic.Int32
	// stalledMs, when set, is the loop stall its Status answers report (a server that knows its loop is
	// stuck says so).
	stalledMs atomic.Uint64
}

func (s *stuckLeader) Status(context.Context, *leasepb.StatusRequest) (*leasepb.StatusResponse, error) {
	return &leasepb.StatusResponse{Role: leasepb.Role_ROLE_LEADER, LoopStalledMs: s.stalledMs.Load()}, nil
}

func (s *stuckLeader) Acquire(ctx context.Context, _ *leasepb.AcquireRequest) (*leasepb.AcquireResponse, error) {
	s.acquires.Add(1)
	<-ctx.Done()
	return nil, ctx.Err()
}

func serveStuckLeader(t *testing.T) (*stuckLeader, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &stuckLeader{}
	srv := grpc.NewServer()
	leasepb.RegisterLeasesServer(srv, viaUnary{s})
	leasepb.RegisterClusterServer(srv, s)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return s, lis.Addr().String()
}

// slowStatusOf delays the Status answers of the node at addr by 200 ms, so that discovery picks another
// node (a stuck one) first.
func slowStatusOf(addr string) grpc.UnaryClientInterceptor {
	return delayStatusOf(addr, 200*time.Millisecond)
}

// delayStatusOf delays the Status answers of the node at addr by d.
func delayStatusOf(addr string, d time.Duration) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method == leasepb.Cluster_Status_FullMethodName && strings.HasSuffix(cc.Target(), "/"+addr) {
			select {
			case <-time.After(d): // injected delay
			case <-ctx.Done():
			}
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

// TestAttemptOnAStuckNodeEndsAndTheNextNodeAnswers: the first node the client tries (it claims to lead)
// never answers Acquire. The attempt ends after its share of RequestTimeout, the next node answers within
// the call's deadline, and the stuck node is remembered: the next call does not wait on it again. Before
// per-attempt deadlines the first attempt took the whole deadline.
func TestAttemptOnAStuckNodeEndsAndTheNextNodeAnswers(t *testing.T) {
	cl := servertest.Start(t, 1, nil)
	real := cl.Endpoints()[0]
	stuck, stuckAddr := serveStuckLeader(t)
	c := newClient(t, []string{stuckAddr, real}, func(cfg *client.Config) {
		cfg.DialOptions = []grpc.DialOption{grpc.WithUnaryInterceptor(slowStatusOf(real))}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := c.Acquire(ctx, "gray/stuck", client.WithTTL(10*time.Second)); err != nil {
		t.Fatalf("acquire after %v: %v", time.Since(start), err)
	}
	took := time.Since(start)
	t.Logf("first acquire answered in %v", took)
	if stuck.acquires.Load() != 1 {
		t.Fatalf("the stuck node got %d Acquires, want the first attempt only", stuck.acquires.Load())
	}
	if took > 2500*time.Millisecond {
		t.Fatalf("acquire took %v, want one attempt's share (%v) plus a retry", took, 5*time.Second/3)
	}
	start = time.Now()
	if _, err := c.Acquire(ctx, "gray/stuck2", client.WithTTL(10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 500*time.Millisecond || stuck.acquires.Load() != 1 {
		t.Fatalf("second acquire took %v and the stuck node got %d Acquires: it was not remembered", took, stuck.acquires.Load())
	}
}

// TestShortCallsLeaveAStuckLeader: the same stuck leader, but every call has a deadline shorter than one
// attempt's share (500 ms against 1.67 s), as a read with its own short budget does. The first attempt
// gets half of the call and blames the stuck node, so the call, or at the latest the next, is answered
// by the real node, and the calls after it do not go to the stuck node again. When such an attempt was
// ended by the call's own deadline and blamed nobody, every call went to the stuck node and failed.
func TestShortCallsLeaveAStuckLeader(t *testing.T) {
	cl := servertest.Start(t, 1, nil)
	real := cl.Endpoints()[0]
	stuck, stuckAddr := serveStuckLeader(t)
	c := newClient(t, []string{stuckAddr, real}, func(cfg *client.Config) {
		cfg.DialOptions = []grpc.DialOption{grpc.WithUnaryInterceptor(slowStatusOf(real))}
	})
	acquire := func(i int) error {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		_, err := c.Acquire(ctx, fmt.Sprintf("gray/short/%d", i), client.WithTTL(10*time.Second))
		return err
	}
	var errs []error
	for i := range 2 {
		if err := acquire(i); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 2 {
		t.Fatalf("neither of two 500 ms calls was answered: %v", errs)
	}
	before := stuck.acquires.Load()
	for i := range 5 {
		if err := acquire(10 + i); err != nil {
			t.Fatalf("call %d after the stuck node was found: %v", i, err)
		}
	}
	if got := stuck.acquires.Load(); got != before {
		t.Fatalf("the stuck node got %d more Acquires after it was found", got-before)
	}
}

// TestWatchLeavesABlackHoledNodeThroughKeepalivePings: watch streams are quiet by nature and have no
// watchdog; when the link to the node serving one black-holes, the connection's keepalive pings go
// unanswered, gRPC closes it (PingInterval 10s, gRPC's floor, + PingTimeout 3s), and the watch resumes on
// another node without losing the event that happened meanwhile. Without keepalive it waited forever.
func TestWatchLeavesABlackHoledNodeThroughKeepalivePings(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a keepalive ping to time out (about 15s)")
	}
	cl := servertest.Start(t, 3, nil)
	leader := cl.Endpoints()[cl.WaitLeader()]
	bh := newBlackHole()
	watcher := newClient(t, cl.Endpoints(), func(cfg *client.Config) {
		cfg.DialOptions = []grpc.DialOption{bh.dialOption()}
		cfg.PingTimeout = time.Second
	})
	writer := newClient(t, cl.Endpoints(), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	acquire := func(resource string) uint64 {
		l, err := writer.Acquire(ctx, resource, client.WithTTL(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		return l.Token()
	}
	first := acquire("ka/1")
	events := make(chan client.Event, 16)
	errc := make(chan error, 1)
	go func() {
		errc <- watcher.Watch(ctx, client.WatchOptions{Prefix: "ka/", FromIndex: first}, func(e client.Event) error {
			events <- e
			return nil
		})
	}()
	defer func() { cancel(); <-errc }()
	select {
	case e := <-events:
		if e.Index != first {
			t.Fatalf("first event at %d, want %d", e.Index, first)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the watch delivered nothing")
	}
	bh.hole(leader) // the watch's stream is on the leader it discovered
	second := acquire("ka/2")
	select {
	case e := <-events:
		if e.Index != second {
			t.Fatalf("after the black hole the watch delivered index %d, want %d", e.Index, second)
		}
	case <-time.After(25 * time.Second):
		t.Fatal("the watch never left the black-holed node")
	}
}

// TestKeepAliveRidesOutASlowLink is the slow-but-alive case: every byte the client sends reaches the node
// 400 ms late, so each renewal is answered after the keeper's watchdog (TTL/6 = 250 ms) has given up on
// it, yet well within the TTL. The abandoned streams are still read, their late answers extend the lease
// from each round's send time, and the lease survives several TTLs. Abandoning a stream used to drop its
// answers with it, so every renewal was lost and so was the lease.
func TestKeepAliveRidesOutASlowLink(t *testing.T) {
	cl := servertest.Start(t, 1, nil)
	slow := &latencyDialer{}
	c := newClient(t, cl.Endpoints(), func(cfg *client.Config) {
		cfg.DialOptions = []grpc.DialOption{grpc.WithContextDialer(slow.dial)}
	})
	ctx := ctxT(t)
	const ttl = 1500 * time.Millisecond
	l, err := c.Acquire(ctx, "gray/slow", client.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	slow.delay.Store(int64(400 * time.Millisecond))
	slowedAt := time.Now()
	for end := slowedAt.Add(4 * ttl); time.Now().Before(end); {
		select {
		case <-l.Done():
			t.Fatalf("lease lost %v after the link slowed down: %v", time.Since(slowedAt), l.Err())
		case <-time.After(50 * time.Millisecond): // observation interval
		}
	}
}

// latencyDialer's connections deliver what the client writes delay late (a long link, not a narrow one:
// writes queue, none waits for another).
type latencyDialer struct {
	delay atomic.Int64 // nanoseconds
}

func (d *latencyDialer) dial(ctx context.Context, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	lc := &latencyConn{Conn: conn, delay: &d.delay, queue: make(chan delayedWrite, 1024), closed: make(chan struct{})}
	lc.wg.Go(lc.pump)
	return lc, nil
}

type delayedWrite struct {
	due time.Time
	b   []byte
}

type latencyConn struct {
	net.Conn
	delay     *atomic.Int64
	queue     chan delayedWrite
	closeOnce sync.Once
	closed    chan struct{}
	wg        sync.WaitGroup
}

func (c *latencyConn) Write(p []byte) (int, error) {
	w := delayedWrite{due: time.Now().Add(time.Duration(c.delay.Load())), b: append([]byte(nil), p...)}
	select {
	case c.queue <- w:
		return len(p), nil
	case <-c.closed:
		return 0, net.ErrClosed
	}
}

// pump writes each queued chunk when it is due.
func (c *latencyConn) pump() {
	for {
		select {
		case w := <-c.queue:
			t := time.NewTimer(time.Until(w.due))
			select {
			case <-t.C: // the link's latency, simulated
			case <-c.closed:
				t.Stop()
				return
			}
			if _, err := c.Conn.Write(w.b); err != nil {
				return
			}
		case <-c.closed:
			return
		}
	}
}

func (c *latencyConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	err := c.Conn.Close()
	c.wg.Wait()
	return err
}

// TestDiscoveryPassesOverAStalledLeader: a node that says it leads but reports its loop stalled (a
// leader blocked in a disk write, whose peers have elected another) answers Status first; the real
// leader answers later than the discovery grace. Discovery waits for the real leader's answer — a stalled
// node's answer neither names a leader nor starts the grace — and no Acquire ever goes to the stalled
// node. When discovery took the first node claiming to lead, a client kept choosing a stalled leader until
// its lease ran out (chaos, disk-stall-leader).
func TestDiscoveryPassesOverAStalledLeader(t *testing.T) {
	cl := servertest.Start(t, 1, nil)
	real := cl.Endpoints()[0]
	stalled, stalledAddr := serveStuckLeader(t)
	stalled.stalledMs.Store(700)
	c := newClient(t, []string{stalledAddr, real}, func(cfg *client.Config) {
		cfg.DialOptions = []grpc.DialOption{grpc.WithUnaryInterceptor(delayStatusOf(real, 300*time.Millisecond))} // > discoveryGrace
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i := range 3 {
		if _, err := c.Acquire(ctx, fmt.Sprintf("gray/stalled/%d", i), client.WithTTL(10*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if n := stalled.acquires.Load(); n != 0 {
		t.Fatalf("the stalled leader got %d Acquires, want none: discovery chose it", n)
	}
}
