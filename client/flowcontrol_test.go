package client_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/leased/leased/client"
	"github.com/leased/leased/server/servertest"
)

// A call costs the client one write: gRPC's bandwidth-delay estimator, left on at either end, adds a
// window update and a PING per answer (the client's receive side) or a PING ack per request (the
// node's), tripling the writes and wake-ups of a call (client.go, responseStreamWindow; server.go,
// clientStreamWindow).
func TestACallIsOneWrite(t *testing.T) {
	const calls = 100
	cl := servertest.Start(t, 3, nil)
	d := &countingDialer{}
	c := newClient(t, cl.Endpoints(), func(cfg *client.Config) {
		cfg.DialOptions = []grpc.DialOption{grpc.WithContextDialer(d.dial)}
	})
	ctx := ctxT(t)
	l, err := c.Acquire(ctx, "calls", client.WithTTL(time.Minute)) // the keeper stays quiet for 20 s
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Renew(ctx, "calls", l.Token()); err != nil { // settles on the leader's connection
		t.Fatal(err)
	}
	before := d.writes.Load()
	for range calls {
		if _, err := c.Renew(ctx, "calls", l.Token()); err != nil {
			t.Fatal(err)
		}
	}
	if w := d.writes.Load() - before; w > calls*12/10 {
		t.Fatalf("%d calls took %d writes, want at most %d", calls, w, calls*12/10)
	}
}

// countingDialer dials TCP and counts the writes to every connection it made.
type countingDialer struct{ writes atomic.Int64 }

func (d *countingDialer) dial(ctx context.Context, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &countedConn{Conn: conn, writes: &d.writes}, nil
}

type countedConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *countedConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}
