package client

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	gbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
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

	// ctx ends when the client closes; the client's own goroutines (leader discovery) run under it.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	conns  map[string]*grpc.ClientConn
	causes map[*grpc.ClientConn]*connCause // the last failure of each connection's connecting (cause.go)
	addrs  map[*grpc.ClientConn]string     // the endpoint each connection dials
	// batchers coalesce each connection's quick writes and send them on its Writes stream (batch.go,
	// writestream.go); with Config.NoBatching each write goes as its own call.
	batchers map[*grpc.ClientConn]*batcher
	leader   string // the address the client currently prefers; "" when unknown
	next     int    // round-robin position among the endpoints
	closed   bool
	health   map[string]health // endpoints that did not answer in time, skipped until their backoff ends
	// discoveryFailures is why each endpoint last failed to answer a leader discovery, and when: a call
	// that fails names them for the endpoints it did not try itself.
	discoveryFailures map[string]timedError
	discovery         chan struct{} // closed when the leader discovery in flight ends; nil when none is

	keeper *keeper
}

// health is what the client remembers of an endpoint that did not answer in time.
type health struct {
	fails int
	until time.Time // skip the endpoint until then
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
	c := &Client{
		cfg: cfg, log: cfg.Logger, clock: cfg.Clock, budget: newRetryBudget(), metrics: m,
		conns: make(map[string]*grpc.ClientConn), health: make(map[string]health), discoveryFailures: make(map[string]timedError),
		causes: make(map[*grpc.ClientConn]*connCause), addrs: make(map[*grpc.ClientConn]string),
		batchers: make(map[*grpc.ClientConn]*batcher),
	}
	if len(cfg.Endpoints) == 1 {
		c.leader = cfg.Endpoints[0]
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
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
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	c.cancel()
	c.keeper.close()
	c.wg.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, b := range c.batchers {
		b.close()
	}
	var errs []error
	for _, conn := range c.conns {
		errs = append(errs, conn.Close())
	}
	return errors.Join(errs...)
}

// The receive windows of a connection to a node (see conn). Watch streams are the largest readers; a
// stream window this size still carries 100 MB/s at a 10 ms round trip.
const (
	responseStreamWindow = 1 << 20
	responseConnWindow   = 4 << 20
)

// conn returns a connection to addr, dialling it lazily. Every connection pings a silent server
// (Config.PingInterval, PingTimeout) and bounds each connection attempt by Config.DialTimeout.
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
	cause := &connCause{withTLS: c.cfg.TLS != nil}
	if c.cfg.TLS != nil {
		creds = &watchedCreds{TransportCredentials: credentials.NewTLS(c.cfg.TLS), cause: cause}
	}
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithContextDialer(cause.dialer), // Config.DialOptions may replace it (then no dial cause is kept)
		grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time: c.cfg.PingInterval, Timeout: c.cfg.PingTimeout, PermitWithoutStream: true,
		}),
		// Fixed receive windows turn off gRPC's bandwidth-delay estimator, which otherwise answers
		// nearly every response with a window update and a PING (and the node with a PING ack): two
		// more writes per call on each side. Answers and watch events are small.
		grpc.WithInitialWindowSize(responseStreamWindow),
		grpc.WithInitialConnWindowSize(responseConnWindow),
		grpc.WithConnectParams(grpc.ConnectParams{
			// Reconnect soon after a node comes back: the endpoint's own backoff (health) already keeps
			// calls away from a node that keeps failing.
			Backoff:           gbackoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 3 * time.Second},
			MinConnectTimeout: c.cfg.DialTimeout,
		}),
	}, c.metrics.dialOptions()...)
	opts = append(opts, c.cfg.DialOptions...)
	// passthrough: the dialer resolves the name, so a name that does not resolve is a cause it keeps.
	conn, err := grpc.NewClient("passthrough:///"+addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", addr, err)
	}
	c.conns[addr] = conn
	c.causes[conn] = cause
	c.addrs[conn] = addr
	c.batchers[conn] = newBatcher(c.ctx, conn, addr, c.cfg.NoBatching, c.metrics)
	return conn, nil
}

// writer is what sends the quick writes on conn: its batcher.
func (c *Client) writer(conn *grpc.ClientConn) *batcher {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.batchers[conn]
}

// errNotConnected: an endpoint did not complete its connection within the attempt.
var errNotConnected = errors.New("not connected")

// ready waits, at most DialTimeout and never beyond ctx, for conn to be connected. A connection that
// fails (refused, reset) returns at once, so the call can move on, with the reason (a *connectError); one
// whose TLS handshake failed says why (ErrUnauthenticated).
func (c *Client) ready(ctx context.Context, conn *grpc.ClientConn) error {
	start := time.Now()
	err := c.waitReady(ctx, conn)
	if err == nil {
		return nil
	}
	c.mu.Lock()
	cause, isTLS := c.causes[conn].get()
	addr := c.addrs[conn]
	c.mu.Unlock()
	if cause != nil && isTLS {
		return tlsProblem(addr, cause)
	}
	if errors.Is(err, errNotConnected) {
		detail := fmt.Sprintf("not connected within %v", time.Since(start).Round(time.Millisecond))
		if st := conn.GetState(); st == connectivity.TransientFailure || st == connectivity.Shutdown {
			detail = "connection failed (" + strings.ToLower(st.String()) + ")"
		}
		return &connectError{addr: addr, err: cause, detail: detail}
	}
	return err
}

func (c *Client) waitReady(ctx context.Context, conn *grpc.ClientConn) error {
	st := conn.GetState()
	if st == connectivity.Ready {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.DialTimeout)
	defer cancel()
	conn.Connect()
	for {
		switch st = conn.GetState(); st {
		case connectivity.Ready:
			return nil
		case connectivity.TransientFailure, connectivity.Shutdown:
			return fmt.Errorf("%w: %s", errNotConnected, st)
		}
		if !conn.WaitForStateChange(ctx, st) {
			return fmt.Errorf("%w within %v: %s", errNotConnected, c.cfg.DialTimeout, st)
		}
	}
}

// attemptTimeout is one attempt's share of a call: max(RequestTimeout/3, 500ms).
func (c *Client) attemptTimeout() time.Duration {
	return max(c.cfg.RequestTimeout/3, 500*time.Millisecond)
}

// minAttemptShare is the least attemptShare splits a short call into.
const minAttemptShare = 100 * time.Millisecond

// attemptShare is how long the next attempt of a call whose context is ctx may take: attemptTimeout, or,
// when less than that is left of the call, half of what is left (all of it when that is under twice
// minAttemptShare). A node that does not answer within its share is remembered as unresponsive; an
// attempt that the call's own deadline ended blames nobody. Without the split, a call with a deadline
// shorter than one share (a 500 ms read, say) never blamed a frozen leader, and every such call went to
// it again for as long as it stayed frozen (the chaos monitor's 11 s windows during freeze-leader).
func (c *Client) attemptShare(ctx context.Context) time.Duration {
	share := c.attemptTimeout()
	dl, ok := ctx.Deadline()
	if !ok {
		return share
	}
	switch left := time.Until(dl); {
	case left > share:
		return share
	case left < 2*minAttemptShare:
		return left
	default:
		return left / 2
	}
}

// target is the endpoint to try now: the known leader unless it is unresponsive, else the leader that a
// discovery (all endpoints asked in parallel) finds, else a responsive endpoint in turn.
func (c *Client) target(ctx context.Context) string {
	c.mu.Lock()
	now := time.Now()
	if c.leader != "" && !c.unresponsiveLocked(c.leader, now) {
		defer c.mu.Unlock()
		return c.leader
	}
	if len(c.cfg.Endpoints) == 1 { // nobody else to ask
		defer c.mu.Unlock()
		return c.cfg.Endpoints[0]
	}
	wait := c.discovery
	if wait == nil && !c.closed {
		wait = make(chan struct{})
		c.discovery = wait
		c.wg.Go(func() { c.discover(wait) })
	}
	c.mu.Unlock()
	if wait != nil {
		select {
		case <-wait:
		case <-ctx.Done():
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leader != "" && !c.unresponsiveLocked(c.leader, time.Now()) {
		return c.leader
	}
	return c.nextLocked(time.Now())
}

// nextLocked is the next endpoint in turn that is not unresponsive; if all are, the next in turn (so
// that a call tries every endpoint, and can say why each failed).
func (c *Client) nextLocked(now time.Time) string {
	n := len(c.cfg.Endpoints)
	for range n {
		c.next = (c.next + 1) % n
		if ep := c.cfg.Endpoints[c.next]; !c.unresponsiveLocked(ep, now) {
			return ep
		}
	}
	c.next = (c.next + 1) % n
	return c.cfg.Endpoints[c.next]
}

func (c *Client) unresponsiveLocked(addr string, now time.Time) bool {
	h, ok := c.health[addr]
	return ok && now.Before(h.until)
}

// unresponsive remembers that addr did not answer in time: it is skipped for 1s, doubling with every
// further failure up to 30s, then tried again. If it was the preferred node, the leader is unknown again.
func (c *Client) unresponsive(addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.health[addr]
	h.fails++
	h.until = time.Now().Add(min(time.Second<<min(h.fails-1, 5), 30*time.Second))
	c.health[addr] = h
	if c.leader == addr {
		c.leader = ""
	}
	c.log.Debug("endpoint unresponsive", "endpoint", addr, "failures", h.fails, "skip_until", h.until)
}

// responsive forgets an endpoint's failures: it answered.
func (c *Client) responsive(addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.health, addr)
}

// discover asks every endpoint that is not unresponsive, in parallel, who leads, and prefers the first
// leader named that is not itself unresponsive; failing that, the first endpoint that answered, and a node
// whose loop has stalled only if no other answered. Endpoints that do not answer within an attempt's share
// are remembered as unresponsive.
func (c *Client) discover(done chan struct{}) {
	ctx, cancel := context.WithTimeout(c.ctx, c.attemptTimeout())
	defer cancel()
	type answer struct {
		addr, leader string
		stalled      bool // the node's loop has stalled: its answer is the last resort
		err          error
	}
	c.mu.Lock()
	now := time.Now()
	var ask []string
	for _, ep := range c.cfg.Endpoints {
		if !c.unresponsiveLocked(ep, now) {
			ask = append(ask, ep)
		}
	}
	if len(ask) == 0 {
		ask = c.cfg.Endpoints
	}
	c.mu.Unlock()
	answers := make(chan answer, len(ask))
	var wg sync.WaitGroup
	for _, ep := range ask {
		wg.Go(func() {
			st, err := c.statusOf(ctx, ep)
			a := answer{addr: ep, err: err}
			if err == nil {
				a.leader, a.stalled = leaderNamedBy(ep, st), st.GetLoopStalledMs() > 0
			}
			answers <- a
		})
	}
	var leader, answered, stalled string
	var grace <-chan time.Time // once a node answered without naming a usable leader, wait only a little more
collect:
	for range ask {
		var a answer
		select {
		case a = <-answers:
		case <-grace:
			break collect
		}
		if a.err != nil {
			if errors.Is(a.err, errNotConnected) || (ctx.Err() != nil && c.ctx.Err() == nil) {
				c.unresponsive(a.addr)
			}
			c.mu.Lock()
			c.discoveryFailures[a.addr] = timedError{err: a.err, at: time.Now()}
			c.mu.Unlock()
			continue
		}
		c.responsive(a.addr)
		if a.stalled { // it answers, but cannot act: wait for the others as if it had not
			stalled = cmp.Or(stalled, a.addr)
			continue
		}
		if answered == "" {
			answered = a.addr
			t := time.NewTimer(discoveryGrace)
			defer t.Stop()
			grace = t.C
		}
		c.mu.Lock()
		usable := a.leader != "" && !c.unresponsiveLocked(a.leader, time.Now())
		c.mu.Unlock()
		if usable {
			leader = a.leader
			break collect
		}
	}
	cancel() // the slower answers are not needed any more
	wg.Wait()
	for range len(answers) { // answers that came after the collection ended
		if a := <-answers; a.err != nil && !errors.Is(a.err, context.Canceled) && status.Code(a.err) != codes.Canceled {
			c.mu.Lock()
			c.discoveryFailures[a.addr] = timedError{err: a.err, at: time.Now()}
			c.mu.Unlock()
		}
	}
	c.mu.Lock()
	leader = cmp.Or(leader, answered, stalled)
	if leader != "" {
		c.leader = leader
	}
	c.discovery = nil
	c.mu.Unlock()
	close(done)
	c.log.Debug("leader discovery", "leader", leader)
}

// leaderNamedBy is the leader a Status answer from addr names: addr itself if it leads, else its
// header's hint. A node whose loop has stalled names none, whatever it says of its role: it cannot act
// on it, and its peers may have elected another leader.
func leaderNamedBy(addr string, st *leasepb.StatusResponse) string {
	switch {
	case st.GetLoopStalledMs() > 0:
		return ""
	case st.GetRole() == leasepb.Role_ROLE_LEADER:
		return addr
	default:
		return st.GetHeader().GetLeaderAddr()
	}
}

// discoveryGrace is how long discovery waits for a leader's name after the first node answered without one.
const discoveryGrace = 200 * time.Millisecond

// statusOf asks one endpoint about itself. A refusal (a server without the Cluster service, or an
// identity that may not ask) counts as an answer that names no leader.
func (c *Client) statusOf(ctx context.Context, addr string) (*leasepb.StatusResponse, error) {
	conn, err := c.conn(addr)
	if err != nil {
		return nil, err
	}
	if err := c.ready(ctx, conn); err != nil {
		return nil, err
	}
	st, err := leasepb.NewClusterClient(conn).Status(ctx, &leasepb.StatusRequest{})
	switch status.Code(err) {
	case codes.Unimplemented, codes.PermissionDenied, codes.Unauthenticated:
		return &leasepb.StatusResponse{}, nil
	}
	return st, err
}

// follow records the leader named by an answer, so later calls go straight there — unless that node did
// not answer in time lately (followers keep naming a frozen leader until they elect another).
func (c *Client) follow(h *leasepb.ResponseHeader) {
	if addr := h.GetLeaderAddr(); addr != "" {
		c.mu.Lock()
		if !c.unresponsiveLocked(addr, time.Now()) {
			c.leader = addr
		}
		c.mu.Unlock()
	}
}

// moveOn picks where to go after an Unavailable answer: the leader it named, else whatever the next
// target finds (a discovery).
func (c *Client) moveOn(failed, hint string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if hint != "" && hint != failed && !c.unresponsiveLocked(hint, time.Now()) {
		c.leader = hint
		return
	}
	if c.leader == failed {
		if len(c.cfg.Endpoints) == 1 {
			return
		}
		c.leader = ""
	}
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
		addr := c.target(ctx)
		conn, err := c.conn(addr)
		if err != nil {
			return zero, err
		}
		out, err := attemptOnce(ctx, c, o, conn, rpc)
		if err == nil {
			c.budget.success()
			c.responsive(addr)
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
			c.unresponsive(addr)
		case !retryable(err):
			return zero, fromStatus(err)
		default:
			c.moveOn(addr, leaderHint(err))
		}
		pause := backoff(attempt)
		// Every endpoint a dead end: fail after refusedPatience, not at the deadline. A queued (unbounded)
		// Acquire follows an answer, and waits out outages as its caller asked.
		if dead, left := causes.deadEnds(c.cfg.Endpoints); dead && !o.unbounded {
			if left <= 0 {
				return zero, &unavailableError{causes: causes.withDiscovered(c)}
			}
			pause = min(pause, left)
		}
		if !c.budget.spend() {
			return zero, &unavailableError{causes: causes.withDiscovered(c), why: "retry budget exhausted"}
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
		d = c.attemptShare(ctx)
		share := time.Now().Add(d)
		dl, ok := ctx.Deadline()
		own = !ok || share.Before(dl)
		var cancel context.CancelFunc
		actx, cancel = context.WithDeadline(ctx, share)
		defer cancel()
	}
	if err := c.ready(actx, conn); err != nil {
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
