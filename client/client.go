package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Config configures a Client. Zero values take the defaults documented on each field.
type Config struct {
	// Endpoints are client addresses of cluster nodes (host:port). At least one is required; the client
	// finds the leader from the answers and goes straight to it.
	Endpoints []string
	// TLS, when set, secures every connection: RootCAs verifies the servers (nil: the system's roots),
	// Certificates is the client certificate that servers with --client-cert-auth require. A handshake
	// failure ends the call at once with ErrUnauthenticated, naming the TLS problem.
	TLS *tls.Config
	// DialTimeout bounds connecting to one endpoint (TCP and the HTTP/2 handshake) within an attempt: a node
	// that does not complete it in time is skipped for this attempt and remembered as unresponsive.
	// Default 5s (an attempt's own share, below, usually ends first).
	DialTimeout time.Duration
	// RequestTimeout bounds a whole call when the caller's context has no deadline. Each attempt on one node
	// gets a share of it, max(RequestTimeout/3, 500ms), after which the next node is tried while the call's
	// deadline lasts; when less than a share is left of the call, the attempt gets half of what is left
	// (all of it under 200ms), so that a short call still reaches a second node. Default 5s.
	RequestTimeout time.Duration
	// PingInterval is how long a connection may be silent before the client sends an HTTP/2 PING, and
	// PingTimeout how long it waits for the answer before closing the connection (failing its calls and
	// streams, so they move to another node). Pings are sent even without calls in flight. gRPC raises
	// intervals below 10s to 10s; servers must permit that (leased enforces a minimum of 5s, with pings
	// permitted without streams). Defaults 10s and 3s.
	PingInterval, PingTimeout time.Duration
	// ClockDrift is the largest relative difference between this machine's clock rate and the servers'
	// (0.01 = 1%). A lease is trusted only until its last successful renewal's send time + TTL × (1 −
	// ClockDrift) − MinDriftMargin. Default 0.01.
	ClockDrift float64
	// MinDriftMargin is subtracted from every validity window on top of ClockDrift. Default 20ms.
	MinDriftMargin time.Duration
	// KeepAliveBatch is the most leases one KeepAlive message renews; it must not exceed the servers'
	// --max-keepalive-leases (10,000 by default). Default 5,000.
	KeepAliveBatch int
	// Holder names this process in its leases. Default hostname:pid.
	Holder string
	// Logger receives the client's logs; nil discards them.
	Logger *slog.Logger
	// DialOptions are added to every connection (tests use them to inject a dialer).
	DialOptions []grpc.DialOption
	// Clock is the time source for lease validity; nil means the real clock. Tests inject one.
	Clock Clock
	// NoBatching sends every write as its own call. By default the quick writes (Acquire without
	// WithWait, Renew, Release) travel as requests on one Writes stream per connection, and those that
	// goroutines of this client make at the same moment as one request, each run and answered as its own
	// call would be (docs/client.md, "Batching"). Set it to see every write as its own call in gRPC unary
	// interceptors given in DialOptions.
	NoBatching bool
	// Registerer, when set, receives the client's metrics (leased_client_*: docs/operations.md, "Metrics");
	// nil records none. One Registerer serves one Client: New fails if the series are registered already.
	Registerer prometheus.Registerer
}

// Clock is the client's time source. Now must include a monotonic reading.
type Clock interface {
	Now() time.Time
	// AfterFunc runs f after d, like time.AfterFunc.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is the part of *time.Timer the client uses.
type Timer interface{ Stop() bool }

type realClock struct{}

func (realClock) Now() time.Time                            { return time.Now() }
func (realClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// Client talks to a leased cluster. It is safe for concurrent use; Close it when done.
type Client struct {
	cfg    Config
	log    *slog.Logger
	clock  Clock
	budget *retryBudget
	// metrics is nil without Config.Registerer.
	metrics *clientMetrics

	// ctx ends when the client closes; the client's own goroutines run under it.
	ctx    context.Context
	cancel context.CancelFunc
	// endpoints is where calls go: connections, the leader, endpoints that did not answer (endpoints.go).
	endpoints *endpoints

	keeper *keeper
}

// New returns a client for the cluster. It does not wait for a connection.
func New(cfg Config) (*Client, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, fmt.Errorf("%w: no endpoints", ErrInvalid)
	}
	if cfg.KeepAliveBatch < 0 {
		return nil, fmt.Errorf("%w: KeepAliveBatch %d is negative", ErrInvalid, cfg.KeepAliveBatch)
	}
	cfg = withDefaults(cfg)
	m, err := newClientMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	c := &Client{cfg: cfg, log: cfg.Logger, clock: cfg.Clock, budget: newRetryBudget(), metrics: m}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.endpoints = newEndpoints(c.ctx, cfg, m)
	c.keeper = newKeeper(c)
	return c, nil
}

func withDefaults(cfg Config) Config {
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = 5 * time.Second
	}
	if cfg.PingInterval == 0 {
		cfg.PingInterval = 10 * time.Second
	}
	if cfg.PingTimeout == 0 {
		cfg.PingTimeout = 3 * time.Second
	}
	if cfg.ClockDrift == 0 {
		cfg.ClockDrift = 0.01
	}
	if cfg.MinDriftMargin == 0 {
		cfg.MinDriftMargin = 20 * time.Millisecond
	}
	if cfg.KeepAliveBatch == 0 {
		cfg.KeepAliveBatch = 5000
	}
	if cfg.Holder == "" {
		host, _ := os.Hostname()
		cfg.Holder = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = realClock{}
	}
	return cfg
}

// Holder is the holder name this client puts in its leases.
func (c *Client) Holder() string { return c.cfg.Holder }

// Close stops keeping leases alive (each held Lease ends with ErrClosed; the cluster expires them after their
// TTL unless released first) and closes every connection.
func (c *Client) Close() error {
	if !c.endpoints.shut() {
		return nil
	}
	c.cancel()
	c.keeper.close()
	return c.endpoints.close()
}

// callOptions change how call bounds its attempts.
type callOptions struct {
	// unbounded attempts run until the call's context ends (a queued Acquire must keep its place).
	unbounded bool
	// sent, when set, receives the time (Config.Clock) the answered attempt was sent, once connected.
	sent *time.Time
}

// call runs one RPC against the leader (or, for reads, any node), retrying Unavailable answers on other
// nodes with full-jitter exponential backoff under the client's retry budget, until ctx ends. Each attempt
// is bounded by its share of the call (attemptTimeout) and its connecting by DialTimeout; a node that
// misses either is remembered as unresponsive and the next one is tried.
func call[T any](ctx context.Context, c *Client, rpc func(context.Context, *grpc.ClientConn) (T, error)) (T, error) {
	return callWith(ctx, c, callOptions{}, rpc)
}

func callWith[T any](ctx context.Context, c *Client, o callOptions, rpc func(context.Context, *grpc.ClientConn) (T, error)) (T, error) {
	var zero T
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.RequestTimeout)
		defer cancel()
	}
	causes := newCallCauses()
	for attempt := 0; ; attempt++ {
		addr := c.endpoints.target(ctx)
		conn, err := c.endpoints.conn(addr)
		if err != nil {
			return zero, err
		}
		out, err := attemptOnce(ctx, c, o, conn, rpc)
		if err == nil {
			c.budget.success()
			c.endpoints.responsive(addr)
			return out, nil
		}
		if errors.Is(err, ErrUnauthenticated) { // a TLS failure: the same credentials fail everywhere
			return zero, err
		}
		err = wrongService(ctx, conn, addr, err)
		causes.note(addr, err, ctx.Err() != nil)
		if ctx.Err() != nil {
			if definitive(err) {
				return zero, fromStatus(err)
			}
			return zero, causes.ended(ctx, c)
		}
		switch {
		case errors.Is(err, errNotConnected), errors.Is(err, errAttemptTimeout), errors.Is(err, ErrNotClientPort):
			c.endpoints.unresponsive(addr)
		case !retryable(err):
			return zero, fromStatus(err)
		default:
			c.endpoints.moveOn(addr, leaderHint(err))
		}
		pause := backoff(attempt)
		// Every endpoint a dead end: fail after refusedPatience, not at the deadline. A queued (unbounded)
		// Acquire follows an answer, and waits out outages as its caller asked.
		if dead, left := causes.deadEnds(c.cfg.Endpoints); dead && !o.unbounded {
			if left <= 0 {
				return zero, &unavailableError{causes: causes.withDiscovered(c.endpoints)}
			}
			pause = min(pause, left)
		}
		if !c.budget.spend() {
			return zero, &unavailableError{causes: causes.withDiscovered(c.endpoints), why: "retry budget exhausted"}
		}
		if err := sleepCtx(ctx, pause); err != nil {
			return zero, causes.ended(ctx, c)
		}
	}
}

// errAttemptTimeout: one attempt used up its share of the call; the call goes on elsewhere.
var errAttemptTimeout = errors.New("attempt timed out")

// attempt is one try of rpc on conn: connected within DialTimeout, answered within its share of the call.
func attemptOnce[T any](ctx context.Context, c *Client, o callOptions, conn *grpc.ClientConn, rpc func(context.Context, *grpc.ClientConn) (T, error)) (T, error) {
	var zero T
	actx := ctx
	var d time.Duration // the attempt's share (attemptShare)
	own := false        // the attempt's deadline comes before the call's: running out of it is the node's fault
	if !o.unbounded {
		d = c.endpoints.attemptShare(ctx)
		share := time.Now().Add(d)
		dl, ok := ctx.Deadline()
		own = !ok || share.Before(dl)
		var cancel context.CancelFunc
		actx, cancel = context.WithDeadline(ctx, share)
		defer cancel()
	}
	if err := c.endpoints.ready(actx, conn); err != nil {
		return zero, err
	}
	if o.sent != nil {
		*o.sent = c.clock.Now()
	}
	out, err := rpc(actx, conn)
	// gRPC may end the call on its own deadline timer a moment before actx reports it; and the server,
	// which was sent the attempt's deadline as a relative timeout and starts counting on receipt, may end
	// it first (DeadlineExceeded, "stream terminated by RST_STREAM"): with the call's own context still
	// live, that deadline was the attempt's.
	dl, _ := actx.Deadline()
	timedOut := actx.Err() != nil || !time.Now().Before(dl) || status.Code(err) == codes.DeadlineExceeded
	if err != nil && own && ctx.Err() == nil && timedOut {
		return zero, fmt.Errorf("%w after %v: %w", errAttemptTimeout, d.Round(time.Millisecond), err)
	}
	return out, err
}

// backoff is full-jitter exponential: uniform in [0, min(cap, base·2^attempt)], so a cluster-wide hiccup
// does not turn into synchronised retry waves.
func backoff(attempt int) time.Duration {
	const base, ceiling = 25 * time.Millisecond, 2 * time.Second
	d := base << min(attempt, 10)
	if d > ceiling {
		d = ceiling
	}
	return time.Duration(rand.Int64N(int64(d) + 1))
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// retryBudget caps retries at about 10 per second plus 20% of successful calls, shared by all calls of
// a client, so that an outage costs the cluster a bounded amount of extra load.
type retryBudget struct {
	mu     sync.Mutex
	tokens float64
	last   time.Time
}

const (
	budgetMax       = 50
	budgetPerSec    = 10
	budgetPerOK     = 0.2
	budgetRetryCost = 1
)

func newRetryBudget() *retryBudget { return &retryBudget{tokens: budgetMax, last: time.Now()} }

func (b *retryBudget) refill() {
	now := time.Now()
	b.tokens = min(budgetMax, b.tokens+now.Sub(b.last).Seconds()*budgetPerSec)
	b.last = now
}

func (b *retryBudget) success() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill()
	b.tokens = min(budgetMax, b.tokens+budgetPerOK)
}

func (b *retryBudget) spend() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill()
	if b.tokens < budgetRetryCost {
		return false
	}
	b.tokens -= budgetRetryCost
	return true
}
