package e2e

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
)

// retrier sends calls to one node of the cluster and, when the answer is Unavailable or DeadlineExceeded
// (the node is down, has no leader, or the outcome is unknown), sends the same request to the next node
// after a bounded backoff. Callers keep requests idempotent: Acquire reuses its request_id.
type retrier struct {
	c       *cluster
	target  int
	timeout time.Duration // per attempt
	budget  time.Duration // per call, across attempts
}

func newRetrier(c *cluster, target int) *retrier {
	return &retrier{c: c, target: target, timeout: time.Second, budget: 15 * time.Second}
}

func retryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return true
	}
	return false
}

// do runs fn until it succeeds or fails for good. It returns when the last attempt started.
func (r *retrier) do(fn func(ctx context.Context, c leasepb.LeasesClient) error) (started time.Time, err error) {
	deadline := time.Now().Add(r.budget)
	pause := 10 * time.Millisecond
	for attempt := 1; ; attempt++ {
		started = time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
		err = fn(ctx, r.c.Leases(r.target))
		cancel()
		if !retryable(err) {
			return started, err
		}
		if time.Now().Add(pause).After(deadline) {
			return started, fmt.Errorf("%w after %d attempts: %v", errGaveUp, attempt, err)
		}
		r.target = (r.target + 1) % len(r.c.Nodes)
		time.Sleep(pause) // backoff between attempts, not a wait for a condition
		pause = min(2*pause, 200*time.Millisecond)
	}
}

// acquire acquires resource for holder under requestID, retrying as do does.
func (r *retrier) acquire(resource, holder, requestID string, ttl time.Duration) (*leasepb.AcquireResponse, time.Time, error) {
	var resp *leasepb.AcquireResponse
	started, err := r.do(func(ctx context.Context, c leasepb.LeasesClient) (err error) {
		resp, err = c.Acquire(ctx, &leasepb.AcquireRequest{
			Resource: resource, Holder: holder, RequestId: requestID, TtlMs: ttl.Milliseconds(),
		})
		return err
	})
	return resp, started, err
}

// release releases a lease; NotFound (a retry after a release that did apply) counts as released.
func (r *retrier) release(resource string, token uint64) error {
	_, err := r.do(func(ctx context.Context, c leasepb.LeasesClient) error {
		_, err := c.Release(ctx, &leasepb.ReleaseRequest{Resource: resource, Token: token})
		if status.Code(err) == codes.NotFound {
			return nil
		}
		return err
	})
	return err
}

// get reads the current lease of resource, linearizably.
func (r *retrier) get(resource string) (*leasepb.Lease, error) {
	var lease *leasepb.Lease
	_, err := r.do(func(ctx context.Context, c leasepb.LeasesClient) error {
		resp, err := c.Get(ctx, &leasepb.GetRequest{Resource: resource})
		lease = resp.GetLease()
		return err
	})
	return lease, err
}
