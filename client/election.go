package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"

	"github.com/leased/leased/api/leasepb"
)

// Leader election on top of leases: the leader is whoever holds the election's resource, and its lease
// value says who it is (an address or an id). The fencing token doubles as the leader's epoch: a larger
// token is a later leader.

// Campaign blocks until this process leads the election named resource (FIFO among candidates), then
// returns the lease that makes it leader. Leadership ends when the lease's Done closes; resign with
// Release. value identifies the leader to observers.
func (c *Client) Campaign(ctx context.Context, resource string, value []byte, opts ...AcquireOption) (*Lease, error) {
	return c.Acquire(ctx, resource, append([]AcquireOption{WithValue(value)}, append(opts, WithWait())...)...)
}

// NewElector returns a candidate for the election cfg names.
func (c *Client) NewElector(cfg ElectorConfig) (*Elector, error) {
	if cfg.Resource == "" {
		return nil, fmt.Errorf("%w: elector needs a resource", ErrInvalid)
	}
	if cfg.Callbacks.OnStartedLeading == nil {
		return nil, fmt.Errorf("%w: elector needs an OnStartedLeading callback", ErrInvalid)
	}
	if cfg.TTL == 0 {
		cfg.TTL = 10 * time.Second
	}
	if cfg.RetryPeriod == 0 {
		cfg.RetryPeriod = time.Second
	}
	return &Elector{c: c, cfg: cfg}, nil
}

// LeaderInfo is who leads an election.
type LeaderInfo struct {
	Holder string
	Value  []byte
	// Token is the leader's fencing token: its epoch.
	Token uint64
}

// Leader returns the current leader of the election, or an error wrapping ErrNotFound when there is none.
func (c *Client) Leader(ctx context.Context, resource string) (LeaderInfo, error) {
	info, err := c.Get(ctx, resource)
	if err != nil {
		return LeaderInfo{}, err
	}
	return LeaderInfo{Holder: info.Holder, Value: info.Value, Token: info.Token}, nil
}

// Observe calls fn with the election's leader now and at every change: the new leader, the leader's new
// value after a Proclaim (same Token), or a zero LeaderInfo while there is none. It returns when ctx ends or fn returns an error.
func (c *Client) Observe(ctx context.Context, resource string, fn func(LeaderInfo) error) error {
	// Read the current state and the index it reflects together, then watch from the next index.
	from, err := observeStart(ctx, c, resource, fn)
	if err != nil {
		return err
	}
	return c.Watch(ctx, WatchOptions{Resource: resource, FromIndex: from}, func(e Event) error {
		if e.Type == Granted || e.Type == ValueChanged {
			return fn(LeaderInfo{Holder: e.Lease.Holder, Value: e.Lease.Value, Token: e.Lease.Token})
		}
		return fn(LeaderInfo{})
	})
}

// observeStart reports the election's leader now and returns the index to watch from. A Get that finds the
// lease answers with the applied index of the very state it read, so watching from the next index misses
// and repeats nothing. A Get that finds nothing carries no index: then a List gives a later one, and a
// second Get looks again — a grant made between the reads is found by it (and read atomically); if it
// too finds nothing, every grant before the List's index has been released by then, so watching from the
// index after it loses no leader that is still in office. (A leader elected and gone within the first
// read's own handling is not reported.)
func observeStart(ctx context.Context, c *Client, resource string, fn func(LeaderInfo) error) (uint64, error) {
	info, idx, err := getAt(ctx, c, resource)
	if err == nil {
		return idx + 1, fn(leaderOf(info))
	}
	if !errors.Is(err, ErrNotFound) {
		return 0, err
	}
	applied, err := appliedIndex(ctx, c, resource)
	if err != nil {
		return 0, err
	}
	info, idx, err = getAt(ctx, c, resource)
	switch {
	case err == nil:
		return idx + 1, fn(leaderOf(info))
	case errors.Is(err, ErrNotFound):
		return applied + 1, fn(LeaderInfo{})
	}
	return 0, err
}

func leaderOf(info Info) LeaderInfo {
	return LeaderInfo{Holder: info.Holder, Value: info.Value, Token: info.Token}
}

// getAt reads the lease on resource (linearizably) with the applied index of the state the answer was
// read from.
func getAt(ctx context.Context, c *Client, resource string) (Info, uint64, error) {
	resp, err := call(ctx, c, func(ctx context.Context, conn *grpc.ClientConn) (*leasepb.GetResponse, error) {
		return leasepb.NewLeasesClient(conn).Get(ctx, &leasepb.GetRequest{Resource: resource})
	})
	if err != nil {
		return Info{}, 0, err
	}
	c.endpoints.follow(resp.GetHeader())
	return infoOf(resp.GetLease()), resp.GetHeader().GetAppliedIndex(), nil
}
