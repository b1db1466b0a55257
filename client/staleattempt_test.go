package client_test

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/leased/leased/client"
	"github.com/leased/leased/server/servertest"
)

// Stale attempts (I6): an Acquire attempt held up on a stalled
// link reaches the leader only after a later attempt of the same request id was answered. It must change
// nothing.

// stallDialer dials through net.Dialer; while an address is stalled, what is written to its connections
// is held (like a TCP link whose packets are queued, not lost) and delivered when it heals. What it
// delivers at heal leaves out HTTP/2 RST_STREAM frames, so that the server reads the abandoned request
// and not its cancellation: the worst case of the race the soak hit (there the request was proposed before
// the reset arrived).
type stallDialer struct {
	mu    sync.Mutex
	conns map[string][]*stallConn
}

func newStallDialer() *stallDialer { return &stallDialer{conns: map[string][]*stallConn{}} }

func (d *stallDialer) dialOption() grpc.DialOption { return grpc.WithContextDialer(d.dial) }

func (d *stallDialer) dial(ctx context.Context, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	sc := &stallConn{Conn: conn}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.conns[addr] = append(d.conns[addr], sc)
	return sc, nil
}

func (d *stallDialer) each(addr string, fn func(*stallConn)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.conns[addr] {
		fn(c)
	}
}

// stall starts holding what is written to addr's connections.
func (d *stallDialer) stall(addr string) { d.each(addr, func(c *stallConn) { c.stall() }) }

// heal delivers what was held and lets later writes through; answered then reports whether a byte came
// back on one of addr's connections since.
func (d *stallDialer) heal(t *testing.T, addr string) {
	d.each(addr, func(c *stallConn) {
		if err := c.heal(); err != nil {
			t.Errorf("deliver the held bytes to %s: %v", addr, err)
		}
	})
}

func (d *stallDialer) answered(addr string) bool {
	got := false
	d.each(addr, func(c *stallConn) { got = got || c.readAfterHeal.Load() })
	return got
}

type stallConn struct {
	net.Conn
	mu            sync.Mutex
	stalled       bool
	held          []byte
	healed        atomic.Bool
	readAfterHeal atomic.Bool
}

func (c *stallConn) stall() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stalled = true
}

func (c *stallConn) heal() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stalled = false
	held := withoutResets(c.held)
	c.held = nil
	c.healed.Store(true)
	_, err := c.Conn.Write(held)
	return err
}

func (c *stallConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stalled {
		c.held = append(c.held, p...)
		return len(p), nil
	}
	return c.Conn.Write(p)
}

func (c *stallConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && c.healed.Load() {
		c.readAfterHeal.Store(true)
	}
	return n, err
}

// withoutResets drops the RST_STREAM frames (type 3) from b, a run of whole HTTP/2 frames (the stall began
// on an idle connection, between frames).
func withoutResets(b []byte) []byte {
	const header, rstStream = 9, 3
	var out []byte
	for len(b) >= header {
		n := header + int(binary.BigEndian.Uint32(append([]byte{0}, b[:3]...)))
		if n > len(b) {
			break
		}
		if b[3] != rstStream {
			out = append(out, b[:n]...)
		}
		b = b[n:]
	}
	return append(out, b...)
}

// staleAttemptClient is w5 of the soak: its attempts give up after 1s (RequestTimeout/3), no pings
// cross the stalled link, and its connections go through d.
func staleAttemptClient(t *testing.T, cl *servertest.Cluster, d *stallDialer) *client.Client {
	return newClient(t, cl.Endpoints(), func(cfg *client.Config) {
		cfg.Holder = "w5"
		cfg.RequestTimeout = 3 * time.Second
		cfg.PingInterval, cfg.PingTimeout = time.Hour, time.Hour
		cfg.DialOptions = append(cfg.DialOptions, d.dialOption())
	})
}

// leaderConnected has c acquire and release a warm-up lease, so that it knows the leader and holds an
// idle connection to it; it returns the leader's address.
func leaderConnected(ctx context.Context, t *testing.T, cl *servertest.Cluster, c *client.Client) string {
	t.Helper()
	leader := cl.Endpoints()[cl.WaitLeader()]
	for {
		l, err := c.Acquire(ctx, "warm-up", client.WithTTL(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if now := cl.Endpoints()[cl.WaitLeader()]; now == leader {
			return leader
		}
		leader = cl.Endpoints()[cl.WaitLeader()]
	}
}

// deliverLate heals the stalled leader link and waits until the leader answered what it held: the
// delayed attempt was applied. Then resource must be free.
func deliverLate(ctx context.Context, t *testing.T, d *stallDialer, leader string, observer *client.Client, resource string) {
	t.Helper()
	d.heal(t, leader)
	for !d.answered(leader) {
		if ctx.Err() != nil {
			t.Fatal("the leader never answered the delayed attempt")
		}
		time.Sleep(10 * time.Millisecond) // polling for the answer
	}
	if got, err := observer.Get(ctx, resource); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("after the delayed attempt applied, %s is %+v (err %v): a stale attempt took effect", resource, got, err)
	}
}

// TestDelayedAttemptAfterHeldDoesNotGrant is the soak's failure: attempt 1 is held on a stalled link,
// attempt 2 is answered Held, the holder's lease ends, then attempt 1 arrives. Before attempt numbers,
// it granted the resource to a caller that had been told "held".
func TestDelayedAttemptAfterHeldDoesNotGrant(t *testing.T) {
	cl := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	d := newStallDialer()
	w5 := staleAttemptClient(t, cl, d)
	leader := leaderConnected(ctx, t, cl, w5)
	w1 := newClient(t, cl.Endpoints(), func(cfg *client.Config) { cfg.Holder = "w1" })
	held, err := w1.Acquire(ctx, "hot/74/0", client.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}

	d.stall(leader)
	_, err = w5.Acquire(ctx, "hot/74/0", client.WithTTL(10*time.Second))
	var he *client.HeldError
	if !errors.As(err, &he) || he.Holder != "w1" {
		t.Fatalf("w5's acquire = %v, want held by w1", err)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	deliverLate(ctx, t, d, leader, w1, "hot/74/0")
}

// TestDelayedAttemptAfterReleaseDoesNotGrantAgain: attempt 1 is held, attempt 2 is granted, the holder
// releases, then attempt 1 arrives. Before, the state machine had forgotten the request id and granted
// again, a lease nobody holds.
func TestDelayedAttemptAfterReleaseDoesNotGrantAgain(t *testing.T) {
	cl := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	d := newStallDialer()
	w5 := staleAttemptClient(t, cl, d)
	leader := leaderConnected(ctx, t, cl, w5)

	d.stall(leader)
	l, err := w5.Acquire(ctx, "hot/74/0", client.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	observer := newClient(t, cl.Endpoints(), nil)
	deliverLate(ctx, t, d, leader, observer, "hot/74/0")
}

// A request id reused by a later Acquire call (WithRequestID) after a refusal is asked again under a
// later attempt number, and granted once the resource is free; after its grant ended it is
// ErrSuperseded, saying so.
func TestReusedRequestIDAfterHeldAndAfterItsGrantEnded(t *testing.T) {
	cl := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	w1 := newClient(t, cl.Endpoints(), func(cfg *client.Config) { cfg.Holder = "w1" })
	w5 := newClient(t, cl.Endpoints(), func(cfg *client.Config) { cfg.Holder = "w5" })
	held, err := w1.Acquire(ctx, "reuse", client.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w5.Acquire(ctx, "reuse", client.WithRequestID("X")); !errors.Is(err, client.ErrHeld) {
		t.Fatalf("first call = %v, want held", err)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := w5.Acquire(ctx, "reuse", client.WithRequestID("X"))
	if err != nil {
		t.Fatalf("second call with the same request id after the resource freed: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = w5.Acquire(ctx, "reuse", client.WithRequestID("X"))
	var se *client.SupersededError
	if !errors.As(err, &se) || !errors.Is(err, client.ErrSuperseded) || !se.GrantEnded || se.RequestID != "X" {
		t.Fatalf("a call after the request id's grant ended = %v, want ErrSuperseded with GrantEnded", err)
	}
	t.Log(err)
}
