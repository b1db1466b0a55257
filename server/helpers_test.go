package server_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server/servertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func code(err error) codes.Code { return status.Code(err) }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// eventually polls cond until it holds or the timeout passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// listRetrying lists through any running node, retrying Unavailable and DeadlineExceeded (a leader
// change on a loaded machine).
func listRetrying(c *servertest.Cluster, ctx context.Context, req *leasepb.ListRequest) (*leasepb.ListResponse, error) {
	for attempt := 0; ; attempt++ {
		cl := c.Leases(attempt % c.Size())
		if cl == nil {
			continue
		}
		callCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := cl.List(callCtx, req)
		cancel()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		switch code(err) {
		case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		default:
			return resp, err
		}
		time.Sleep(20 * time.Millisecond) // backoff between retries
	}
}

// acquireRetrying acquires through any running node, retrying Unavailable and DeadlineExceeded with the
// same request id, as the SDK does.
func acquireRetrying(c *servertest.Cluster, ctx context.Context, req *leasepb.AcquireRequest) (*leasepb.AcquireResponse, error) {
	for attempt := 0; ; attempt++ {
		cl := c.Leases(attempt % c.Size())
		if cl == nil {
			continue
		}
		callCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := cl.Acquire(callCtx, req)
		cancel()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		switch code(err) {
		case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled: // Canceled: the test closed that node's conn
		default:
			return resp, err
		}
		time.Sleep(20 * time.Millisecond) // backoff between retries
	}
}
