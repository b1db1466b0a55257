package client_test

import (
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/leased/leased/client"
	"github.com/leased/leased/client/clienttest"
	"github.com/leased/leased/server/servertest"
)

// TestDoneBeforeServerExpiryWithinTheDriftBound: a client whose clock runs 0.5% slow — within the configured
// 1% drift bound, and the dangerous direction, since it believes less time has passed — still sees Done
// before the cluster expires its lease once it is cut off.
func TestDoneBeforeServerExpiryWithinTheDriftBound(t *testing.T) {
	cl := servertest.Start(t, 3, nil)
	d := &cutDialer{}
	c := newClient(t, cl.Endpoints(), func(cfg *client.Config) {
		cfg.Clock = clienttest.NewSkewedClock(0.995)
		cfg.ClockDrift = 0.01
		cfg.DialOptions = []grpc.DialOption{grpc.WithContextDialer(d.dial)}
	})
	observer := newClient(t, cl.Endpoints(), nil)
	ctx := ctxT(t)
	l, err := c.Acquire(ctx, "drift", client.WithTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	expired := watchExpiry(ctx, t, observer, "drift")
	d.cutOff()
	select {
	case <-l.Done():
	case <-ctx.Done():
		t.Fatal("the cut-off lease never ended")
	}
	doneAt := time.Now()
	select {
	case at := <-expired:
		if !at.After(doneAt) {
			t.Fatalf("server expired at %v, before the skewed client's Done at %v", at, doneAt)
		}
		t.Logf("Done %v before the server's expiry", at.Sub(doneAt))
	case <-time.After(10 * time.Second):
		t.Fatal("no expiry")
	}
}
