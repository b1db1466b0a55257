package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

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

// endpoints is where a client's calls go: it keeps one connection to each endpoint, follows the leader
// that answers name, skips endpoints that did not answer in time (with a backoff), and asks every
// endpoint who leads when it does not know. The calls (call, Watch, the keeper) ask it for a target and
// tell it how the target answered. Safe for concurrent use.
type endpoints struct {
	cfg     Config // the client's, with defaults
	log     *slog.Logger
	metrics *clientMetrics // nil without Config.Registerer
	// ctx ends when the client closes; leader discoveries and the batchers run under it.
	ctx context.Context
	wg  sync.WaitGroup // leader discoveries in flight

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
}

// health is what the client remembers of an endpoint that did not answer in time.
type health struct {
	fails int
	until time.Time // skip the endpoint until then
}

func newEndpoints(ctx context.Context, cfg Config, m *clientMetrics) *endpoints {
	e := &endpoints{
		cfg: cfg, log: cfg.Logger, metrics: m, ctx: ctx,
		conns: make(map[string]*grpc.ClientConn), health: make(map[string]health), discoveryFailures: make(map[string]timedError),
		causes: make(map[*grpc.ClientConn]*connCause), addrs: make(map[*grpc.ClientConn]string),
		batchers: make(map[*grpc.ClientConn]*batcher),
	}
	if len(cfg.Endpoints) == 1 {
		e.leader = cfg.Endpoints[0]
	}
	return e
}

// shut refuses new connections and discoveries from now on; false if it was shut already.
func (e *endpoints) shut() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return false
	}
	e.closed = true
	return true
}

// close waits for the discoveries in flight (ended by the client's context), then stops the batchers and
// closes every connection.
func (e *endpoints) close() error {
	e.wg.Wait()
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, b := range e.batchers {
		b.close()
	}
	var errs []error
	for _, conn := range e.conns {
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
func (e *endpoints) conn(addr string) (*grpc.ClientConn, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, ErrClosed
	}
	if conn, ok := e.conns[addr]; ok {
		return conn, nil
	}
	creds := insecure.NewCredentials()
	cause := &connCause{withTLS: e.cfg.TLS != nil}
	if e.cfg.TLS != nil {
		creds = &watchedCreds{TransportCredentials: credentials.NewTLS(e.cfg.TLS), cause: cause}
	}
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithContextDialer(cause.dialer), // Config.DialOptions may replace it (then no dial cause is kept)
		grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time: e.cfg.PingInterval, Timeout: e.cfg.PingTimeout, PermitWithoutStream: true,
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
			MinConnectTimeout: e.cfg.DialTimeout,
		}),
	}, e.metrics.dialOptions()...)
	opts = append(opts, e.cfg.DialOptions...)
	// passthrough: the dialer resolves the name, so a name that does not resolve is a cause it keeps.
	conn, err := grpc.NewClient("passthrough:///"+addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", addr, err)
	}
	e.conns[addr] = conn
	e.causes[conn] = cause
	e.addrs[conn] = addr
	e.batchers[conn] = newBatcher(e.ctx, conn, addr, e.cfg.NoBatching, e.metrics)
	return conn, nil
}

// writer is what sends the quick writes on conn: its batcher.
func (e *endpoints) writer(conn *grpc.ClientConn) *batcher {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.batchers[conn]
}

// errNotConnected: an endpoint did not complete its connection within the attempt.
var errNotConnected = errors.New("not connected")

// ready waits, at most DialTimeout and never beyond ctx, for conn to be connected. A connection that
// fails (refused, reset) returns at once, so the call can move on, with the reason (a *connectError); one
// whose TLS handshake failed says why (ErrUnauthenticated).
func (e *endpoints) ready(ctx context.Context, conn *grpc.ClientConn) error {
	start := time.Now()
	err := e.waitReady(ctx, conn)
	if err == nil {
		return nil
	}
	e.mu.Lock()
	cause, isTLS := e.causes[conn].get()
	addr := e.addrs[conn]
	e.mu.Unlock()
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

func (e *endpoints) waitReady(ctx context.Context, conn *grpc.ClientConn) error {
	st := conn.GetState()
	if st == connectivity.Ready {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.DialTimeout)
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
			return fmt.Errorf("%w within %v: %s", errNotConnected, e.cfg.DialTimeout, st)
		}
	}
}

// attemptTimeout is one attempt's share of a call: max(RequestTimeout/3, 500ms).
func (e *endpoints) attemptTimeout() time.Duration {
	return max(e.cfg.RequestTimeout/3, 500*time.Millisecond)
}

// minAttemptShare is the least attemptShare splits a short call into.
const minAttemptShare = 100 * time.Millisecond

// attemptShare is how long the next attempt of a call whose context is ctx may take: attemptTimeout, or,
// when less than that is left of the call, half of what is left (all of it when that is under twice
// minAttemptShare). A node that does not answer within its share is remembered as unresponsive; an
// attempt that the call's own deadline ended blames nobody. Without the split, a call with a deadline
// shorter than one share (a 500 ms read, say) never blamed a frozen leader, and every such call went to
// it again for as long as it stayed frozen (the chaos monitor's 11 s windows during freeze-leader).
func (e *endpoints) attemptShare(ctx context.Context) time.Duration {
	share := e.attemptTimeout()
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
func (e *endpoints) target(ctx context.Context) string {
	e.mu.Lock()
	now := time.Now()
	if e.leader != "" && !e.unresponsiveLocked(e.leader, now) {
		defer e.mu.Unlock()
		return e.leader
	}
	if len(e.cfg.Endpoints) == 1 { // nobody else to ask
		defer e.mu.Unlock()
		return e.cfg.Endpoints[0]
	}
	wait := e.discovery
	if wait == nil && !e.closed {
		wait = make(chan struct{})
		e.discovery = wait
		e.wg.Go(func() { e.discover(wait) })
	}
	e.mu.Unlock()
	if wait != nil {
		select {
		case <-wait:
		case <-ctx.Done():
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.leader != "" && !e.unresponsiveLocked(e.leader, time.Now()) {
		return e.leader
	}
	return e.nextLocked(time.Now())
}

// nextLocked is the next endpoint in turn that is not unresponsive; if all are, the next in turn (so
// that a call tries every endpoint, and can say why each failed).
func (e *endpoints) nextLocked(now time.Time) string {
	n := len(e.cfg.Endpoints)
	for range n {
		e.next = (e.next + 1) % n
		if ep := e.cfg.Endpoints[e.next]; !e.unresponsiveLocked(ep, now) {
			return ep
		}
	}
	e.next = (e.next + 1) % n
	return e.cfg.Endpoints[e.next]
}

func (e *endpoints) unresponsiveLocked(addr string, now time.Time) bool {
	h, ok := e.health[addr]
	return ok && now.Before(h.until)
}

// unresponsive remembers that addr did not answer in time: it is skipped for 1s, doubling with every
// further failure up to 30s, then tried again. If it was the preferred node, the leader is unknown again.
func (e *endpoints) unresponsive(addr string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	h := e.health[addr]
	h.fails++
	h.until = time.Now().Add(min(time.Second<<min(h.fails-1, 5), 30*time.Second))
	e.health[addr] = h
	if e.leader == addr {
		e.leader = ""
	}
	e.log.Debug("endpoint unresponsive", "endpoint", addr, "failures", h.fails, "skip_until", h.until)
}

// responsive forgets an endpoint's failures: it answered.
func (e *endpoints) responsive(addr string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.health, addr)
}

// discover asks every endpoint that is not unresponsive, in parallel, who leads, and prefers the first
// leader named that is not itself unresponsive; failing that, the first endpoint that answered, and a node
// whose loop has stalled only if no other answered. Endpoints that do not answer within an attempt's share
// are remembered as unresponsive.
func (e *endpoints) discover(done chan struct{}) {
	ctx, cancel := context.WithTimeout(e.ctx, e.attemptTimeout())
	defer cancel()
	type answer struct {
		addr, leader string
		stalled      bool // the node's loop has stalled: its answer is the last resort
		err          error
	}
	e.mu.Lock()
	now := time.Now()
	var ask []string
	for _, ep := range e.cfg.Endpoints {
		if !e.unresponsiveLocked(ep, now) {
			ask = append(ask, ep)
		}
	}
	if len(ask) == 0 {
		ask = e.cfg.Endpoints
	}
	e.mu.Unlock()
	answers := make(chan answer, len(ask))
	var wg sync.WaitGroup
	for _, ep := range ask {
		wg.Go(func() {
			st, err := e.statusOf(ctx, ep)
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
			if errors.Is(a.err, errNotConnected) || (ctx.Err() != nil && e.ctx.Err() == nil) {
				e.unresponsive(a.addr)
			}
			e.mu.Lock()
			e.discoveryFailures[a.addr] = timedError{err: a.err, at: time.Now()}
			e.mu.Unlock()
			continue
		}
		e.responsive(a.addr)
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
		e.mu.Lock()
		usable := a.leader != "" && !e.unresponsiveLocked(a.leader, time.Now())
		e.mu.Unlock()
		if usable {
			leader = a.leader
			break collect
		}
	}
	cancel() // the slower answers are not needed any more
	wg.Wait()
	for range len(answers) { // answers that came after the collection ended
		if a := <-answers; a.err != nil && !errors.Is(a.err, context.Canceled) && status.Code(a.err) != codes.Canceled {
			e.mu.Lock()
			e.discoveryFailures[a.addr] = timedError{err: a.err, at: time.Now()}
			e.mu.Unlock()
		}
	}
	e.mu.Lock()
	leader = cmp.Or(leader, answered, stalled)
	if leader != "" {
		e.leader = leader
	}
	e.discovery = nil
	e.mu.Unlock()
	close(done)
	e.log.Debug("leader discovery", "leader", leader)
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
func (e *endpoints) statusOf(ctx context.Context, addr string) (*leasepb.StatusResponse, error) {
	conn, err := e.conn(addr)
	if err != nil {
		return nil, err
	}
	if err := e.ready(ctx, conn); err != nil {
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
func (e *endpoints) follow(h *leasepb.ResponseHeader) {
	if addr := h.GetLeaderAddr(); addr != "" {
		e.mu.Lock()
		if !e.unresponsiveLocked(addr, time.Now()) {
			e.leader = addr
		}
		e.mu.Unlock()
	}
}

// moveOn picks where to go after an Unavailable answer: the leader it named, else whatever the next
// target finds (a discovery).
func (e *endpoints) moveOn(failed, hint string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if hint != "" && hint != failed && !e.unresponsiveLocked(hint, time.Now()) {
		e.leader = hint
		return
	}
	if e.leader == failed {
		if len(e.cfg.Endpoints) == 1 {
			return
		}
		e.leader = ""
	}
}
