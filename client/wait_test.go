package client_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/client"
	"github.com/leased/leased/server/servertest"
)

// acquireLog records the Acquire requests a client sends.
type acquireLog struct {
	mu   sync.Mutex
	reqs []*leasepb.AcquireRequest
}

func (l *acquireLog) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if r, ok := req.(*leasepb.AcquireRequest); ok {
		l.mu.Lock()
		l.reqs = append(l.reqs, r)
		l.mu.Unlock()
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

func (l *acquireLog) sent() []*leasepb.AcquireRequest {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*leasepb.AcquireRequest(nil), l.reqs...)
}

// A wait that runs out after the cluster said "held" is answered "held", with the holder: not a timeout
// (issue #9: leasectl acquire --wait --wait-timeout exited 5 on a loaded machine instead of 3).
func TestWaitingAcquireThatRunsOutIsHeld(t *testing.T) {
	cl := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	alice := newClient(t, cl.Endpoints(), func(c *client.Config) { c.Holder = "alice" })
	la, err := alice.Acquire(ctx, "wait/held", client.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var log acquireLog
	bob := newClient(t, cl.Endpoints(), func(c *client.Config) {
		c.Holder = "bob"
		c.DialOptions = append(c.DialOptions, grpc.WithUnaryInterceptor(log.intercept))
	})

	wctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err = bob.Acquire(wctx, "wait/held", client.WithTTL(10*time.Second), client.WithWait())
	var held *client.HeldError
	if !errors.Is(err, client.ErrHeld) || !errors.As(err, &held) {
		t.Fatalf("want ErrHeld after the wait ran out, got %v", err)
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("a wait that ran out while held must not read as a timeout: %v", err)
	}
	if held.Resource != "wait/held" || held.Holder != "alice" || held.Token != la.Token() {
		t.Fatalf("held by %+v, want alice with token %d", held, la.Token())
	}
	// One intent: a non-waiting ask, then the queued one, with the same request id.
	reqs := log.sent()
	if len(reqs) < 2 || reqs[0].GetWait() || !reqs[len(reqs)-1].GetWait() {
		t.Fatalf("want a non-waiting Acquire and then a waiting one, sent %v", reqs)
	}
	for _, r := range reqs {
		if r.GetRequestId() == "" || r.GetRequestId() != reqs[0].GetRequestId() {
			t.Fatalf("request ids differ between attempts: %v", reqs)
		}
	}
}

// A waiting Acquire of a free resource is granted by its first, non-waiting, attempt.
func TestWaitingAcquireOfAFreeResourceIsGrantedAtOnce(t *testing.T) {
	cl := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	var log acquireLog
	c := newClient(t, cl.Endpoints(), func(c *client.Config) {
		c.DialOptions = append(c.DialOptions, grpc.WithUnaryInterceptor(log.intercept))
	})
	l, err := c.Acquire(ctx, "wait/free", client.WithTTL(10*time.Second), client.WithWait())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Release(ctx) }()
	if reqs := log.sent(); len(reqs) == 0 || reqs[len(reqs)-1].GetWait() {
		t.Fatalf("a free resource needs no waiting Acquire, sent %v", reqs)
	}
}

// A cluster that never answers keeps the timeout: there is no "held" to report.
func TestWaitingAcquireOfAnUnreachableClusterTimesOut(t *testing.T) {
	c := newClient(t, []string{"127.0.0.1:1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := c.Acquire(ctx, "wait/nobody", client.WithTTL(10*time.Second), client.WithWait())
	if errors.Is(err, client.ErrHeld) || !(errors.Is(err, client.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)) {
		t.Fatalf("want unavailable or deadline exceeded, got %v", err)
	}
}
