package client_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/client"
	"github.com/leased/leased/server/servertest"
)

// jumpClock is the real clock plus an offset a test moves forward: a wait that lasted longer than it did.
type jumpClock struct{ offset atomic.Int64 }

func (c *jumpClock) Now() time.Time { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *jumpClock) AfterFunc(d time.Duration, f func()) client.Timer {
	return time.AfterFunc(d, f)
}

// renewCount counts the renewals a client sends, as Renew calls or on its Writes stream.
type renewCount struct{ n atomic.Int64 }

// options install the counting on a client: a unary interceptor and a Writes stream observer.
func (r *renewCount) options() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithChainUnaryInterceptor(r.intercept), observeWrites(func(w *leasepb.BatchWrite) {
		if w.GetRenew() != nil {
			r.n.Add(1)
		}
	})}
}

func (r *renewCount) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if method == "/leased.v1.Leases/Renew" {
		r.n.Add(1)
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// A waiting Acquire granted while its TTL still has most of its window left (counted from when the
// waiting attempt was sent, before the grant) is trusted from that send time without a renewal round
// trip; one that waited through more than two thirds of the window renews before it returns.
func TestWaitedGrantRenewsOnlyAfterALongWait(t *testing.T) {
	const ttl = 30 * time.Second
	cl := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	alice := newClient(t, cl.Endpoints(), func(c *client.Config) { c.Holder = "alice" })
	for _, tc := range []struct {
		name   string
		jump   time.Duration
		renews int64
	}{{"short", 0, 0}, {"long", ttl * 3 / 4, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			resource := "wait/" + tc.name
			la, err := alice.Acquire(ctx, resource, client.WithTTL(ttl))
			if err != nil {
				t.Fatal(err)
			}
			var (
				renews renewCount
				log    acquireLog
			)
			clock := &jumpClock{}
			bob := newClient(t, cl.Endpoints(), func(c *client.Config) {
				c.Holder, c.Clock = "bob", clock
				c.DialOptions = append(append(c.DialOptions, renews.options()...), log.options()...)
			})
			got := make(chan *client.Lease, 1)
			go func() {
				l, err := bob.Acquire(ctx, resource, client.WithTTL(ttl), client.WithWait())
				if err != nil {
					t.Error(err)
				}
				got <- l
			}()
			// Once bob's waiting attempt is sent (sentAt is taken before), the wait lasts as long as the jump.
			for deadline := time.Now().Add(10 * time.Second); !sentWaiting(&log); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("bob never sent a waiting Acquire")
				}
			}
			clock.offset.Store(int64(tc.jump))
			if err := la.Release(ctx); err != nil {
				t.Fatal(err)
			}
			lb := <-got
			if lb == nil {
				t.FailNow()
			}
			defer func() { _ = lb.Release(ctx) }()
			if n := renews.n.Load(); n != tc.renews {
				t.Fatalf("%d renewals before Acquire returned, want %d", n, tc.renews)
			}
			if rem := lb.Remaining(); rem > ttl || rem < ttl/2 {
				t.Fatalf("remaining validity %v of a %v lease", rem, ttl)
			}
		})
	}
}

func sentWaiting(l *acquireLog) bool {
	reqs := l.sent()
	return len(reqs) > 0 && reqs[len(reqs)-1].GetWait()
}
