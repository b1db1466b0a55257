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

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/leased/leased/api/leasepb"
)

// Config configures a Client. Zero values take the defaults documented on each field.
type Config struct {
	// Endpoints are client addresses of cluster nodes (host:port). At least one is required; the client
	// finds the leader from the answers and goes straight to it.
	Endpoints []string
	// TLS, when set, secures every connection (server-side TLS arrives in a later release).
	TLS *tls.Config
	// DialTimeout bounds connecting to one endpoint. Default 5s.
	DialTimeout time.Duration
	// RequestTimeout bounds one attempt of a call when the caller's context has no deadline. Default 5s.
	RequestTimeout time.Duration
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

	mu     sync.Mutex
	conns  map[string]*grpc.ClientConn
	leader string // the address the client currently prefers
	next   int    // round-robin position among the endpoints
	closed bool

	keeper *keeper
}

// New returns a client for the cluster. It does not wait for a connection.
func New(cfg Config) (*Client, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, fmt.Errorf("%w: no endpoints", ErrInvalid)
	}
	cfg = withDefaults(cfg)
	c := &Client{
		cfg: cfg, log: cfg.Logger, clock: cfg.Clock, budget: newRetryBudget(),
		conns: make(map[string]*grpc.ClientConn), leader: cfg.Endpoints[0],
	}
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
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	c.keeper.close()
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for _, conn := range c.conns {
		errs = append(errs, conn.Close())
	}
	return errors.Join(errs...)
}

// conn returns a connection to addr, dialling it lazily.
func (c *Client) conn(addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	if conn, ok := c.conns[addr]; ok {
		return conn, nil
	}
	creds := insecure.NewCredentials()
	if c.cfg.TLS != nil {
		creds = credentials.NewTLS(c.cfg.TLS)
	}
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, c.cfg.DialOptions...)
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", addr, err)
	}
	c.conns[addr] = conn
	return conn, nil
}

// target is the endpoint to try now: the known leader, else the next endpoint in turn.
func (c *Client) target() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leader
}

// follow records the leader named by an answer, so later calls go straight there.
func (c *Client) follow(h *leasepb.ResponseHeader) {
	if addr := h.GetLeaderAddr(); addr != "" {
		c.mu.Lock()
		c.leader = addr
		c.mu.Unlock()
	}
}

// moveOn picks where to go after an Unavailable answer: the leader it named, else the next endpoint.
func (c *Client) moveOn(failed, hint string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if hint != "" && hint != failed {
		c.leader = hint
		return
	}
	if c.leader == failed {
		c.next = (c.next + 1) % len(c.cfg.Endpoints)
		c.leader = c.cfg.Endpoints[c.next]
	}
}

// call runs one RPC against the leader (or, for reads, any node), retrying Unavailable answers on other
// nodes with full-jitter exponential backoff under the client's retry budget, until ctx ends.
func call[T any](ctx context.Context, c *Client, rpc func(context.Context, *grpc.ClientConn) (T, error)) (T, error) {
	var zero T
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.RequestTimeout)
		defer cancel()
	}
	for attempt := 0; ; attempt++ {
		addr := c.target()
		conn, err := c.conn(addr)
		if err != nil {
			return zero, err
		}
		out, err := rpc(ctx, conn)
		if err == nil {
			c.budget.success()
			return out, nil
		}
		if !retryable(err) || ctx.Err() != nil {
			return zero, fromStatus(err)
		}
		c.moveOn(addr, leaderHint(err))
		if !c.budget.spend() {
			return zero, fmt.Errorf("%w: retry budget exhausted: %v", ErrUnavailable, fromStatus(err))
		}
		if err := sleepCtx(ctx, backoff(attempt)); err != nil {
			return zero, fmt.Errorf("%w: %v", ErrUnavailable, fromStatus(err))
		}
	}
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
