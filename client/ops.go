package client

import (
	"context"
	"errors"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
)

// Info describes a lease as the cluster reports it.
type Info struct {
	Resource string
	Holder   string
	Token    uint64
	TTL      time.Duration
	// Remaining is the leader's view of the time left (0 when answered by a follower).
	Remaining time.Duration
	Value     []byte
}

func infoOf(l *leasepb.Lease) Info {
	return Info{
		Resource: l.GetResource(), Holder: l.GetHolder(), Token: l.GetToken(),
		TTL:       time.Duration(l.GetTtlMs()) * time.Millisecond,
		Remaining: time.Duration(l.GetRemainingMs()) * time.Millisecond,
		Value:     l.GetValue(),
	}
}

// Renew renews the lease (resource, token) once and returns its TTL. Most programs hold a *Lease, which
// renews itself; this is for tools such as leasectl.
func (c *Client) Renew(ctx context.Context, resource string, token uint64) (time.Duration, error) {
	resp, err := call(ctx, c, func(ctx context.Context, conn *grpc.ClientConn) (*leasepb.RenewResponse, error) {
		return leasepb.NewLeasesClient(conn).Renew(ctx, &leasepb.RenewRequest{Resource: resource, Token: token})
	})
	if err != nil {
		return 0, err
	}
	c.follow(resp.GetHeader())
	return time.Duration(resp.GetTtlMs()) * time.Millisecond, nil
}

// Release releases the lease (resource, token).
func (c *Client) Release(ctx context.Context, resource string, token uint64) error {
	_, err := call(ctx, c, func(ctx context.Context, conn *grpc.ClientConn) (*leasepb.ReleaseResponse, error) {
		return leasepb.NewLeasesClient(conn).Release(ctx, &leasepb.ReleaseRequest{Resource: resource, Token: token})
	})
	return err
}

// ReadOption configures a read.
type ReadOption func(*readOptions)

type readOptions struct{ serializable bool }

// Serializable reads the answering node's local state: faster, possibly stale, and served without a leader.
func Serializable() ReadOption { return func(o *readOptions) { o.serializable = true } }

func readOpts(opts []ReadOption) readOptions {
	var o readOptions
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// Get returns the current lease on resource, or an error wrapping ErrNotFound.
func (c *Client) Get(ctx context.Context, resource string, opts ...ReadOption) (Info, error) {
	o := readOpts(opts)
	resp, err := call(ctx, c, func(ctx context.Context, conn *grpc.ClientConn) (*leasepb.GetResponse, error) {
		return leasepb.NewLeasesClient(conn).Get(ctx, &leasepb.GetRequest{Resource: resource, Serializable: o.serializable})
	})
	if err != nil {
		return Info{}, err
	}
	c.follow(resp.GetHeader())
	return infoOf(resp.GetLease()), nil
}

// ListOptions select and page a List.
type ListOptions struct {
	Prefix, Holder string
	// Limit is the page size (0: 100). PageToken continues from a previous page's NextPageToken.
	Limit     int
	PageToken string
}

// List returns one page of current leases and the token of the next page ("" on the last).
func (c *Client) List(ctx context.Context, lo ListOptions, opts ...ReadOption) ([]Info, string, error) {
	o := readOpts(opts)
	resp, err := call(ctx, c, func(ctx context.Context, conn *grpc.ClientConn) (*leasepb.ListResponse, error) {
		return leasepb.NewLeasesClient(conn).List(ctx, &leasepb.ListRequest{
			Prefix: lo.Prefix, Holder: lo.Holder, Limit: uint32(lo.Limit), PageToken: lo.PageToken, Serializable: o.serializable,
		})
	})
	if err != nil {
		return nil, "", err
	}
	c.follow(resp.GetHeader())
	out := make([]Info, len(resp.GetLeases()))
	for i, l := range resp.GetLeases() {
		out[i] = infoOf(l)
	}
	return out, resp.GetNextPageToken(), nil
}

// ValidateToken reports, linearizably, whether token is the resource's current grant. Advisory: the answer
// may be stale by the time you act on it; stores that can keep a token should use client/fence.
func (c *Client) ValidateToken(ctx context.Context, resource string, token uint64) (bool, error) {
	resp, err := call(ctx, c, func(ctx context.Context, conn *grpc.ClientConn) (*leasepb.ValidateTokenResponse, error) {
		return leasepb.NewLeasesClient(conn).ValidateToken(ctx, &leasepb.ValidateTokenRequest{Resource: resource, Token: token})
	})
	return resp.GetCurrent(), err
}

// EventType says what happened to a lease.
type EventType int

// Event types.
const (
	Granted EventType = iota + 1
	Released
	Expired
)

func (t EventType) String() string {
	switch t {
	case Granted:
		return "granted"
	case Released:
		return "released"
	case Expired:
		return "expired"
	}
	return "unknown"
}

// Event is one change of a resource's lease.
type Event struct {
	Type  EventType
	Index uint64
	Lease Info
}

// WatchOptions select what a Watch delivers.
type WatchOptions struct {
	// Resource watches one resource; otherwise Prefix ("" = everything).
	Resource, Prefix string
	// FromIndex starts with events at or after this index (0: from now).
	FromIndex uint64
}

// Watch calls fn for every event, in index order, until ctx ends, fn returns an error, or the stream
// fails. When a stream to one node breaks it resumes on another from the index after the last event
// delivered (from FromIndex while none was), so no event is skipped or repeated; a history that no longer
// reaches back gives an error wrapping ErrCompacted. A watch "from now" (FromIndex 0) first reads the
// applied index linearizably and starts after it, so "now" stays put across resumes.
func (c *Client) Watch(ctx context.Context, wo WatchOptions, fn func(Event) error) error {
	next := wo.FromIndex
	if next == 0 {
		// "From now" is pinned to an index before the first stream opens, so that a stream that breaks
		// before delivering anything resumes from there rather than from a later "now".
		applied, err := c.appliedIndex(ctx, wo.Resource+wo.Prefix)
		if err != nil {
			return err
		}
		next = applied + 1
	}
	for attempt := 0; ; attempt++ {
		addr := c.target(ctx)
		got, err := c.watchOnce(ctx, addr, wo, next, fn)
		if got > 0 {
			next, attempt = got+1, 0
		}
		if err == nil || ctx.Err() != nil {
			return ctx.Err()
		}
		var fnErr *callbackError
		// ResourceExhausted: this watcher fell behind the node's event rate; resume from the next index.
		fellBehind := status.Code(err) == codes.ResourceExhausted
		if errors.As(err, &fnErr) || !(retryable(err) || fellBehind || errors.Is(err, errNotConnected)) {
			if fnErr != nil {
				return fnErr.err
			}
			return fromStatus(err)
		}
		if errors.Is(err, errNotConnected) {
			c.unresponsive(addr)
		} else {
			c.moveOn(addr, leaderHint(err))
		}
		if err := sleepCtx(ctx, backoff(attempt)); err != nil {
			return err
		}
	}
}

// appliedIndex is the applied index of a linearizable read: every event after it is "after now".
func (c *Client) appliedIndex(ctx context.Context, prefix string) (uint64, error) {
	resp, err := call(ctx, c, func(ctx context.Context, conn *grpc.ClientConn) (*leasepb.ListResponse, error) {
		return leasepb.NewLeasesClient(conn).List(ctx, &leasepb.ListRequest{Prefix: prefix, Limit: 1})
	})
	if err != nil {
		return 0, err
	}
	c.follow(resp.GetHeader())
	return resp.GetHeader().GetAppliedIndex(), nil
}

type callbackError struct{ err error }

func (e *callbackError) Error() string { return e.err.Error() }

// watchOnce runs one Watch stream; it returns the index of the last event delivered.
func (c *Client) watchOnce(ctx context.Context, addr string, wo WatchOptions, from uint64, fn func(Event) error) (uint64, error) {
	conn, err := c.conn(addr)
	if err != nil {
		return 0, err
	}
	cctx, cancel := context.WithTimeout(ctx, c.attemptTimeout())
	err = c.ready(cctx, conn)
	cancel()
	if err != nil {
		return 0, err
	}
	stream, err := leasepb.NewLeasesClient(conn).Watch(ctx, &leasepb.WatchRequest{Resource: wo.Resource, Prefix: wo.Prefix, FromIndex: from})
	if err != nil {
		return 0, err
	}
	var last uint64
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return last, nil
		}
		if err != nil {
			return last, err
		}
		for _, e := range resp.GetEvents() {
			if err := fn(Event{Type: EventType(e.GetType()), Index: e.GetIndex(), Lease: infoOf(e.GetLease())}); err != nil {
				return last, &callbackError{err}
			}
			last = e.GetIndex()
		}
	}
}
