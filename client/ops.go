package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
)

// Info describes a lease as the cluster reports it.
type Info struct {
	Resource string
	Holder   string
	// Identity is the authenticated identity holding the lease (its certificate's CN or first URI SAN);
	// "" when granted without client certificates.
	Identity string
	// RequestID is the request id the grant was made under, shown only to the identity holding it.
	RequestID string
	Token     uint64
	TTL       time.Duration
	// Remaining is the leader's view of the time left (0 when answered by a follower).
	Remaining time.Duration
	Value     []byte
	// Limit is, for a slot of a counting semaphore, the semaphore's number of slots; 0 for a plain lease.
	Limit int
}

func infoOf(l *leasepb.Lease) Info {
	return Info{
		Resource: l.GetResource(), Holder: l.GetHolder(), Identity: l.GetIdentity(), RequestID: l.GetRequestId(), Token: l.GetToken(),
		TTL:       time.Duration(l.GetTtlMs()) * time.Millisecond,
		Remaining: time.Duration(l.GetRemainingMs()) * time.Millisecond,
		Value:     l.GetValue(),
		Limit:     int(l.GetLimit()),
	}
}

// Acquire takes a lease on resource and keeps it alive until Release, loss, or Close. If the resource is
// held it returns an error wrapping ErrHeld (a *HeldError), unless WithWait is given. If no answer said
// whether the grant happened, the error wraps ErrOutcomeUnknown and OutcomeRequestID gives the call's
// request id.
func (c *Client) Acquire(ctx context.Context, resource string, opts ...AcquireOption) (*Lease, error) {
	o := acquireOptions{ttl: 10 * time.Second, holder: c.cfg.Holder}
	for _, opt := range opts {
		opt(&o)
	}
	if o.requestID == "" {
		o.requestID = newRequestID()
	}
	if o.margin == 0 {
		o.margin = o.ttl / 10
	}
	req := &leasepb.AcquireRequest{
		Resource: resource, Holder: o.holder, TtlMs: o.ttl.Milliseconds(), Value: o.value,
		RequestId: o.requestID, LockDelayMs: o.lockDelay.Milliseconds(), Limit: uint32(max(o.limit, 0)),
	}
	a := &acquisition{c: c, req: req, in: &intent{}, margin: o.margin}
	var l *Lease
	var err error
	if o.wait {
		l, err = a.waiting(ctx)
	} else {
		l, err = a.now(ctx)
	}
	return l, withAcquireOutcome(err, o.requestID)
}

// Proclaim replaces the value of the lease (resource, token), keeping its token and TTL (see
// Lease.Proclaim). It returns the lease with its new value; an error wrapping ErrNotFound means the token
// is no longer current.
func (c *Client) Proclaim(ctx context.Context, resource string, token uint64, value []byte) (Info, error) {
	resp, err := callWrite(ctx, c, "proclaim", callOptions{}, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) (*leasepb.ProclaimResponse, error) {
		return leasepb.NewLeasesClient(conn).Proclaim(ctx, &leasepb.ProclaimRequest{Resource: resource, Token: token, Value: value}, opts...)
	}, nil)
	if err != nil {
		return Info{}, err
	}
	c.endpoints.follow(resp.GetHeader())
	return infoOf(resp.GetLease()), nil
}

// Renew renews the lease (resource, token) once and returns its TTL. Most programs hold a *Lease, which
// renews itself; this is for tools such as leasectl. A NotFound answer is definite (the lease is gone: a
// renewal never ends one); when no attempt got an answer that says whether the renewal happened, the
// error wraps ErrOutcomeUnknown.
func (c *Client) Renew(ctx context.Context, resource string, token uint64) (time.Duration, error) {
	resp, err := callWrite(ctx, c, "renew", callOptions{}, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) (*leasepb.RenewResponse, error) {
		return c.endpoints.writer(conn).renew(ctx, &leasepb.RenewRequest{Resource: resource, Token: token}, opts...)
	}, nil)
	if err != nil {
		return 0, err
	}
	c.endpoints.follow(resp.GetHeader())
	return time.Duration(resp.GetTtlMs()) * time.Millisecond, nil
}

// Release releases the lease (resource, token). It is safe to retry: a release that already took effect
// (an earlier attempt whose answer was lost) is success. ErrNotFound (an *EndedError saying whether the
// lease expired) means the release did not take effect. When the outcome cannot be known (every
// attempt that may have reached the leader went unanswered, and no later one learned what happened),
// the error wraps ErrOutcomeUnknown.
func (c *Client) Release(ctx context.Context, resource string, token uint64) error {
	resp, err := callWrite(ctx, c, "release", callOptions{}, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) (*leasepb.ReleaseResponse, error) {
		return c.endpoints.writer(conn).release(ctx, &leasepb.ReleaseRequest{Resource: resource, Token: token}, opts...)
	}, releaseNotFoundIsDefinite)
	if err == nil {
		c.endpoints.follow(resp.GetHeader())
	}
	return err
}

// releaseNotFoundIsDefinite: after an attempt whose outcome is unknown, a NotFound is definite only if
// the server says how the lease ended (LeaseEnded: expired, or never a grant) and still remembers it. A
// server that does not remember lease ends (an older version), or forgot this one, may be answering a
// release that its own earlier attempt made.
func releaseNotFoundIsDefinite(err error) bool {
	var ended *EndedError
	return errors.As(err, &ended) && !ended.Forgotten
}

// callWrite runs a write through call and notes whether an attempt ended with its outcome unknown
// (outcomeUnknown). If one did and the final answer does not settle it, the error is ErrOutcomeUnknown,
// wrapping that attempt's error (not the final answer: a NotFound that does not settle the outcome must
// not read as a definite ErrNotFound). A final answer settles it when it is a success or
// a refusal the server decided (held, invalid, a limit...); a NotFound settles it only if notFound says
// so (nil: always).
func callWrite[T any](ctx context.Context, c *Client, op string, o callOptions,
	rpc func(context.Context, *grpc.ClientConn, ...grpc.CallOption) (T, error), notFound func(error) bool) (T, error) {
	var unknown error // the last attempt whose outcome is unknown
	out, err := callWith(ctx, c, o, func(ctx context.Context, conn *grpc.ClientConn) (T, error) {
		var p peer.Peer
		out, err := rpc(ctx, conn, grpc.Peer(&p))
		if err != nil && outcomeUnknown(err, p.Addr != nil) {
			unknown = unanswered(err)
		}
		return out, err
	})
	if err == nil || unknown == nil || settled(err, notFound) {
		return out, err
	}
	return out, &outcomeUnknownError{op: op, cause: unknown, final: err}
}

// unanswered is the error of an attempt whose outcome is unknown. gRPC's own deadline ("context deadline
// exceeded") becomes what happened: the request was sent and not answered in time (still errors.Is
// context.DeadlineExceeded).
func unanswered(err error) error {
	st := status.Convert(err)
	switch {
	case st.Code() == codes.DeadlineExceeded && st.Message() == context.DeadlineExceeded.Error():
		return fmt.Errorf("the request was sent but not answered in time (%w)", context.DeadlineExceeded)
	case st.Code() == codes.Canceled && st.Message() == context.Canceled.Error():
		return fmt.Errorf("the request was sent, then the call was canceled (%w)", context.Canceled)
	}
	return fromStatus(err)
}

// settled reports whether a write's final error says what became of the write.
func settled(err error, notFound func(error) bool) bool {
	switch {
	case errors.Is(err, ErrNotFound):
		return notFound == nil || notFound(err)
	case errors.Is(err, ErrUnavailable), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return false
	}
	return true
}

// outcomeUnknown reports whether one attempt's error leaves open whether the write took effect. sent says
// whether the request reached a connection (gRPC picked a transport for it): a request that never did
// cannot have been applied.
func outcomeUnknown(err error, sent bool) bool {
	st := status.Convert(err)
	switch st.Code() {
	case codes.Unavailable:
		for _, d := range st.Details() {
			if h, ok := d.(*leasepb.LeaderHint); ok {
				// A node's answer: it says whether the write may still take effect.
				return h.GetOutcomeUnknown()
			}
		}
		return sent // the connection failed: the request may have been delivered
	case codes.DeadlineExceeded, codes.Canceled:
		return sent // the server gave up waiting for the entry, or the call ended while it waited
	}
	return false
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

// Slots returns the held slots of a semaphore resource in token order (each its own lease, Info.Limit
// the semaphore's size); for a plain lease, that one lease. An error wraps ErrNotFound when the resource
// is free.
func (c *Client) Slots(ctx context.Context, resource string, opts ...ReadOption) ([]Info, error) {
	o := readOpts(opts)
	resp, err := call(ctx, c, func(ctx context.Context, conn *grpc.ClientConn) (*leasepb.GetResponse, error) {
		return leasepb.NewLeasesClient(conn).Get(ctx, &leasepb.GetRequest{Resource: resource, Serializable: o.serializable})
	})
	if err != nil {
		return nil, err
	}
	c.endpoints.follow(resp.GetHeader())
	if len(resp.GetSlots()) == 0 {
		return []Info{infoOf(resp.GetLease())}, nil
	}
	out := make([]Info, len(resp.GetSlots()))
	for i, l := range resp.GetSlots() {
		out[i] = infoOf(l)
	}
	return out, nil
}

// Get returns the current lease on resource (for a semaphore, its oldest slot; see Slots), or an error
// wrapping ErrNotFound.
func (c *Client) Get(ctx context.Context, resource string, opts ...ReadOption) (Info, error) {
	o := readOpts(opts)
	resp, err := call(ctx, c, func(ctx context.Context, conn *grpc.ClientConn) (*leasepb.GetResponse, error) {
		return leasepb.NewLeasesClient(conn).Get(ctx, &leasepb.GetRequest{Resource: resource, Serializable: o.serializable})
	})
	if err != nil {
		return Info{}, err
	}
	c.endpoints.follow(resp.GetHeader())
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
	c.endpoints.follow(resp.GetHeader())
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
	// ValueChanged: a Proclaim replaced a live lease's value (same token); Lease carries the new value.
	ValueChanged EventType = EventType(leasepb.EventType_EVENT_TYPE_VALUE_CHANGED)
)

func (t EventType) String() string {
	switch t {
	case Granted:
		return "granted"
	case Released:
		return "released"
	case Expired:
		return "expired"
	case ValueChanged:
		return "value-changed"
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
		applied, err := appliedIndex(ctx, c, wo.Resource+wo.Prefix)
		if err != nil {
			return err
		}
		next = applied + 1
	}
	for attempt := 0; ; attempt++ {
		addr := c.endpoints.target(ctx)
		got, err := watchOnce(ctx, c, addr, wo, next, fn)
		if got > 0 {
			next, attempt = got+1, 0
		}
		if err == nil || ctx.Err() != nil {
			return ctx.Err()
		}
		var fnErr *callbackError
		// ResourceExhausted: this watcher fell behind the node's event rate; resume from the next index.
		// A limit's refusal (a QuotaFailure naming its flag: --max-watchers, ...) is the caller's to see.
		fellBehind := status.Code(err) == codes.ResourceExhausted && !isLimit(err)
		if errors.As(err, &fnErr) || !(retryable(err) || fellBehind || errors.Is(err, errNotConnected)) {
			if fnErr != nil {
				return fnErr.err
			}
			return fromStatus(err)
		}
		if errors.Is(err, errNotConnected) {
			c.endpoints.unresponsive(addr)
		} else {
			c.endpoints.moveOn(addr, leaderHint(err))
		}
		if err := sleepCtx(ctx, backoff(attempt)); err != nil {
			return err
		}
	}
}

// appliedIndex is the applied index of a linearizable read: every event after it is "after now".
func appliedIndex(ctx context.Context, c *Client, prefix string) (uint64, error) {
	resp, err := call(ctx, c, func(ctx context.Context, conn *grpc.ClientConn) (*leasepb.ListResponse, error) {
		return leasepb.NewLeasesClient(conn).List(ctx, &leasepb.ListRequest{Prefix: prefix, Limit: 1})
	})
	if err != nil {
		return 0, err
	}
	c.endpoints.follow(resp.GetHeader())
	return resp.GetHeader().GetAppliedIndex(), nil
}

type callbackError struct{ err error }

func (e *callbackError) Error() string { return e.err.Error() }

// watchOnce runs one Watch stream; it returns the index of the last event delivered.
func watchOnce(ctx context.Context, c *Client, addr string, wo WatchOptions, from uint64, fn func(Event) error) (uint64, error) {
	conn, err := c.endpoints.conn(addr)
	if err != nil {
		return 0, err
	}
	cctx, cancel := context.WithTimeout(ctx, c.endpoints.attemptTimeout())
	err = c.endpoints.ready(cctx, conn)
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
