package client_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/client"
	"github.com/leased/leased/server/servertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newClient(t *testing.T, endpoints []string, mutate func(*client.Config)) *client.Client {
	t.Helper()
	cfg := client.Config{Endpoints: endpoints, Holder: t.Name()}
	if mutate != nil {
		mutate(&cfg)
	}
	c, err := client.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// watchExpiry has c watch resource until the test ends. The returned channel receives the time at which
// the first Expired event for resource arrived: when the cluster expired the lease, as an observer sees it.
func watchExpiry(ctx context.Context, t *testing.T, c *client.Client, resource string) <-chan time.Time {
	t.Helper()
	expired := make(chan time.Time, 1)
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		_ = c.Watch(wctx, client.WatchOptions{Resource: resource}, func(e client.Event) error {
			if e.Type == client.Expired {
				select {
				case expired <- time.Now():
				default: // only the first expiry counts
				}
			}
			return nil
		})
	})
	t.Cleanup(func() { stop(); wg.Wait() })
	return expired
}

func TestLeaseIsKeptAliveAndReleased(t *testing.T) {
	cl := servertest.Start(t, 3, nil)
	c := newClient(t, cl.Endpoints(), nil)
	ctx := ctxT(t)
	const ttl = 1200 * time.Millisecond // above the 800 ms floor: renewals every 400 ms ride out a loaded machine
	l, err := c.Acquire(ctx, "svc/primary", client.WithTTL(ttl), client.WithValue([]byte("me")))
	if err != nil {
		t.Fatal(err)
	}
	if l.Token() == 0 || l.Remaining() <= 0 || l.Remaining() > ttl {
		t.Fatalf("fresh lease: token %d remaining %v", l.Token(), l.Remaining())
	}
	// Held well past its TTL by the keeper.
	deadline := time.Now().Add(3 * ttl)
	for time.Now().Before(deadline) {
		select {
		case <-l.Done():
			t.Fatalf("lease lost while kept alive: %v", l.Err())
		case <-time.After(50 * time.Millisecond): // observation interval
		}
	}
	info, err := c.Get(ctx, "svc/primary")
	if err != nil || info.Token != l.Token() || string(info.Value) != "me" {
		t.Fatalf("get = %+v, %v", info, err)
	}
	// Someone else is refused with who holds it.
	other := newClient(t, cl.Endpoints(), func(cfg *client.Config) { cfg.Holder = "other" })
	_, err = other.Acquire(ctx, "svc/primary", client.WithTTL(time.Second))
	var held *client.HeldError
	if !errors.As(err, &held) || !errors.Is(err, client.ErrHeld) || held.Token != l.Token() {
		t.Fatalf("second acquire: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	<-l.Done()
	if !errors.Is(l.Err(), client.ErrReleased) || !errors.Is(context.Cause(l.Context()), client.ErrReleased) {
		t.Fatalf("after release: %v", l.Err())
	}
	if _, err := c.Get(ctx, "svc/primary"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("get after release: %v", err)
	}
	if err := l.Fenced(ctx, func(context.Context, uint64) error { return nil }); !errors.Is(err, client.ErrReleased) {
		t.Fatalf("fenced after release: %v", err)
	}
}

func TestLeaseSurvivesLeaderKill(t *testing.T) {
	cl := servertest.Start(t, 3, nil)
	c := newClient(t, cl.Endpoints(), nil)
	ctx := ctxT(t)
	l, err := c.Acquire(ctx, "survivor", client.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	cl.Stop(cl.WaitLeader())
	cl.WaitLeader()
	// Across more than a TTL after the leader died, the lease stays held and renewed.
	end := time.Now().Add(3 * time.Second)
	for time.Now().Before(end) {
		select {
		case <-l.Done():
			t.Fatalf("lease lost across a leader kill: %v", l.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	info, err := c.Get(ctx, "survivor")
	if err != nil || info.Token != l.Token() {
		t.Fatalf("after failover: %+v, %v", info, err)
	}
}

// cutDialer dials through net.Dialer until cut, then refuses and closes every connection it made: a
// client cut off from every node.
type cutDialer struct {
	mu    sync.Mutex
	cut   bool
	conns []net.Conn
}

func (d *cutDialer) dial(ctx context.Context, addr string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cut {
		return nil, errors.New("cut off")
	}
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err == nil {
		d.conns = append(d.conns, conn)
	}
	return conn, err
}

func (d *cutDialer) cutOff() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cut = true
	for _, c := range d.conns {
		_ = c.Close()
	}
}

// TestCutOffHolderSeesDoneBeforeTheServerExpires is invariant I4 end to end: a holder cut off from every
// node sees Done before the cluster expires (and could re-grant) its lease.
func TestCutOffHolderSeesDoneBeforeTheServerExpires(t *testing.T) {
	cl := servertest.Start(t, 3, nil)
	d := &cutDialer{}
	c := newClient(t, cl.Endpoints(), func(cfg *client.Config) {
		cfg.DialOptions = []grpc.DialOption{grpc.WithContextDialer(d.dial)}
	})
	observer := newClient(t, cl.Endpoints(), nil)
	ctx := ctxT(t)
	const ttl = 800 * time.Millisecond
	l, err := c.Acquire(ctx, "cut", client.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	expired := watchExpiry(ctx, t, observer, "cut")
	// Cut only after a renewal has succeeded: the end of the validity window moves only when one does.
	// (Compare ends, not Remaining(): a renewal's window counts from its send time, so right after the
	// answer Remaining() can be a little below what it was just after the Acquire answered.)
	firstEnd := time.Now().Add(l.Remaining())
	for deadline := time.Now().Add(5 * time.Second); !time.Now().Add(l.Remaining()).After(firstEnd.Add(ttl / 6)); {
		if time.Now().After(deadline) {
			t.Fatal("no renewal succeeded within 5s")
		}
		time.Sleep(5 * time.Millisecond) // poll interval
	}
	cutAt := time.Now()
	d.cutOff()
	select {
	case <-l.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done never closed after the cut")
	}
	doneAt := time.Now()
	if !errors.Is(l.Err(), client.ErrLostContact) {
		t.Fatalf("err = %v, want ErrLostContact", l.Err())
	}
	if doneAt.Sub(cutAt) > ttl {
		t.Fatalf("Done closed %v after the cut, more than the TTL", doneAt.Sub(cutAt))
	}
	select {
	case at := <-expired:
		if !at.After(doneAt) {
			t.Fatalf("the server expired the lease (%v) before the holder saw Done (%v)", at, doneAt)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the server never expired the cut-off lease")
	}
}

// TestAcquireRetriedAfterLostAnswerYieldsOneGrant injects the loss of the first Acquire answer (the grant
// happened, the client saw Unavailable): the retry with the same request id returns the same grant. The
// answer is lost on its own call, and on the Writes stream (the stream breaks with the grant in it).
func TestAcquireRetriedAfterLostAnswerYieldsOneGrant(t *testing.T) {
	cl := servertest.Start(t, 3, nil)
	for _, tc := range []struct {
		name string
		lose func(dropped *atomic.Bool) func(*client.Config)
	}{
		{"own-call", func(dropped *atomic.Bool) func(*client.Config) {
			return func(cfg *client.Config) {
				cfg.NoBatching = true
				cfg.DialOptions = []grpc.DialOption{grpc.WithUnaryInterceptor(loseFirstAcquireAnswer(dropped))}
			}
		}},
		{"stream", func(dropped *atomic.Bool) func(*client.Config) {
			return func(cfg *client.Config) {
				cfg.DialOptions = []grpc.DialOption{grpc.WithStreamInterceptor(breakOnFirstGrant(dropped))}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var dropped atomic.Bool
			c := newClient(t, cl.Endpoints(), tc.lose(&dropped))
			ctx := ctxT(t)
			resource := "once/" + tc.name
			l, err := c.Acquire(ctx, resource, client.WithTTL(5*time.Second))
			if err != nil {
				t.Fatalf("acquire after a lost answer: %v", err)
			}
			if !dropped.Load() {
				t.Fatal("the answer was never dropped")
			}
			var grants int
			wctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			defer cancel()
			_ = c.Watch(wctx, client.WatchOptions{Resource: resource, FromIndex: 1}, func(e client.Event) error {
				if e.Type == client.Granted {
					grants++
					if e.Lease.Token != l.Token() {
						t.Errorf("a second grant with token %d (held %d)", e.Lease.Token, l.Token())
					}
				}
				return nil
			})
			if grants != 1 {
				t.Fatalf("%d grants, want exactly 1", grants)
			}
		})
	}
}

// loseFirstAcquireAnswer turns the first successful Acquire call's answer into Unavailable.
func loseFirstAcquireAnswer(dropped *atomic.Bool) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if method == leasepb.Leases_Acquire_FullMethodName && err == nil && dropped.CompareAndSwap(false, true) {
			return status.Error(codes.Unavailable, "injected: answer lost")
		}
		return err
	}
}

// breakOnFirstGrant breaks a Writes stream as it receives the first grant: the client reads Unavailable
// instead of the answer.
func breakOnFirstGrant(dropped *atomic.Bool) grpc.StreamClientInterceptor {
	return onWritesStreams(func(cs grpc.ClientStream) grpc.ClientStream {
		return &grantBreaker{ClientStream: cs, dropped: dropped}
	})
}

type grantBreaker struct {
	grpc.ClientStream
	dropped *atomic.Bool
}

func (g *grantBreaker) RecvMsg(m any) error {
	if err := g.ClientStream.RecvMsg(m); err != nil {
		return err
	}
	for _, r := range m.(*leasepb.WritesResponse).GetResults() {
		if r.GetAcquire().GetLease() != nil && g.dropped.CompareAndSwap(false, true) {
			return status.Error(codes.Unavailable, "injected: stream broke with the answer in it")
		}
	}
	return nil
}

func TestFencedRefusesWhenTooLittleRemains(t *testing.T) {
	cl := servertest.Start(t, 1, nil)
	c := newClient(t, cl.Endpoints(), nil)
	ctx := ctxT(t)
	l, err := c.Acquire(ctx, "f", client.WithTTL(time.Second), client.WithSafetyMargin(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	if err := l.Fenced(ctx, func(context.Context, uint64) error { ran = true; return nil }); !errors.Is(err, client.ErrTooLate) || ran {
		t.Fatalf("fenced with a margin above the TTL: %v (ran %v)", err, ran)
	}
	l2, err := c.Acquire(ctx, "g", client.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got uint64
	if err := l2.Fenced(ctx, func(_ context.Context, tok uint64) error { got = tok; return nil }); err != nil || got != l2.Token() {
		t.Fatalf("fenced = %v, token %d", err, got)
	}
}

func TestCampaignObserveAndResign(t *testing.T) {
	cl := servertest.Start(t, 3, nil)
	a := newClient(t, cl.Endpoints(), func(cfg *client.Config) { cfg.Holder = "a" })
	b := newClient(t, cl.Endpoints(), func(cfg *client.Config) { cfg.Holder = "b" })
	obs := newClient(t, cl.Endpoints(), nil)
	ctx := ctxT(t)

	seen := make(chan client.LeaderInfo, 16)
	octx, stopObs := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = obs.Observe(octx, "election", func(li client.LeaderInfo) error { seen <- li; return nil })
	}()
	defer func() { stopObs(); wg.Wait() }()
	if first := <-seen; first.Holder != "" {
		t.Fatalf("initial leader %+v, want none", first)
	}
	la, err := a.Campaign(ctx, "election", []byte("10.0.0.1:80"), client.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if li := <-seen; li.Holder != "a" || string(li.Value) != "10.0.0.1:80" {
		t.Fatalf("observed %+v, want a", li)
	}
	bLeads := make(chan *client.Lease, 1)
	go func() {
		lb, err := b.Campaign(ctx, "election", []byte("10.0.0.2:80"), client.WithTTL(2*time.Second))
		if err != nil {
			t.Error(err)
		}
		bLeads <- lb
	}()
	leader, err := obs.Leader(ctx, "election")
	if err != nil || leader.Holder != "a" {
		t.Fatalf("leader = %+v, %v", leader, err)
	}
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lb := <-bLeads
	if lb == nil || lb.Token() <= la.Token() {
		t.Fatalf("b's term %v does not follow a's %d", lb, la.Token())
	}
	if li := <-seen; li.Holder != "" {
		t.Fatalf("observed %+v after a resigned, want none", li)
	}
	if li := <-seen; li.Holder != "b" || li.Token != lb.Token() {
		t.Fatalf("observed %+v, want b", li)
	}
}
