package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
)

// A call that cannot reach the cluster used to end in "context deadline exceeded": gRPC retries a failed
// connection quietly and the reason is lost. The client keeps, for every connection, the last real
// failure of its connecting (connection refused, a name that does not resolve, a TLS handshake: see
// tlscause.go), and every call keeps the last real failure of each endpoint it tried. A call that fails
// names those failures instead of its deadline.

// connCause is the last failure of one connection's connecting: a dial error or a TLS failure (tls set).
// It is cleared when a dial succeeds (and a TLS failure is recorded again if the handshake then fails).
type connCause struct {
	mu  sync.Mutex
	err error
	tls bool
	// withTLS: the connection uses TLS (fixed at creation), for what the server's first bytes mean.
	withTLS bool
}

func (c *connCause) setDial(err error) { c.set(err, false) }
func (c *connCause) setTLS(err error)  { c.set(err, true) }

func (c *connCause) set(err error, tls bool) {
	c.mu.Lock()
	c.err, c.tls = err, tls
	c.mu.Unlock()
}

// get returns the last failure and whether it was a TLS one.
func (c *connCause) get() (error, bool) {
	if c == nil {
		return nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err, c.tls
}

// dialer is the connection's TCP dialer: it resolves the address itself (the connection's target uses
// the passthrough resolver, so a name that does not resolve is a dial error the cause can keep) and
// records why a dial failed.
func (c *connCause) dialer(ctx context.Context, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		c.setDial(err)
		return nil, err
	}
	c.setDial(nil)
	return &sniffConn{Conn: conn, cause: c, withTLS: c.withTLS}, nil
}

// connectError is an endpoint that could not be connected to, with the reason in words.
type connectError struct {
	addr string
	err  error // the dial error; nil when the dial succeeded but the connection did not get ready
	// detail says what happened when err is nil ("not connected within 1.7s").
	detail string
}

func (e *connectError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("%s: %s", e.addr, e.detail)
	}
	return fmt.Sprintf("%s: %s", e.addr, dialProblem(e.err))
}

// Is makes errors.Is(err, errNotConnected) true.
func (e *connectError) Is(target error) bool { return target == errNotConnected }

func (e *connectError) Unwrap() error { return e.err }

// deadEnd reports whether the endpoint will not answer however long the call waits: nothing listens on
// its port, its name does not resolve, or it is not a client port.
func (e *connectError) deadEnd() bool {
	var dns *net.DNSError
	return errors.Is(e.err, syscall.ECONNREFUSED) || (errors.As(e.err, &dns) && dns.IsNotFound) ||
		errors.Is(e.err, ErrNotClientPort) // the wrong port, or TLS on one side only (portcause.go)
}

// dialProblem says why a dial failed, without the Go error's repetitions ("dial tcp 127.0.0.1:1:
// connect: connection refused" becomes "connection refused").
func dialProblem(err error) string {
	var dns *net.DNSError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.As(err, &dns) && dns.IsNotFound:
		return fmt.Sprintf("cannot resolve host %q: no such host", dns.Name)
	case errors.As(err, &dns):
		return fmt.Sprintf("cannot resolve host %q: %v", dns.Name, dns.Err)
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "host unreachable"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, syscall.ETIMEDOUT):
		return "connect timed out"
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Err.Error()
	}
	return err.Error()
}

// ErrNotClientPort: an endpoint answers gRPC but not leased's client API; it serves leased's peer (Raft)
// service, or is some other gRPC server. Not retried on that endpoint: it answers the same way every time.
var ErrNotClientPort = errors.New("leased: not a leased client port")

// raftForward is the peer service's unary method: a request without a cluster id is refused by a peer
// port before anything else happens (FailedPrecondition), and answered Unimplemented by anything else.
const raftForward = "/leased.internal.v1.Raft/Forward"

// wrongService turns an Unimplemented "unknown service" answer for the client API into ErrNotClientPort,
// saying whether addr is a leased peer port (it serves the Raft service). Other errors pass unchanged.
func wrongService(ctx context.Context, conn *grpc.ClientConn, addr string, err error) error {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unimplemented || !strings.Contains(st.Message(), "unknown service leased.v1.") {
		return err
	}
	probe := conn.Invoke(ctx, raftForward, &emptypb.Empty{}, &emptypb.Empty{})
	if ps, _ := status.FromError(probe); probe != nil && !strings.Contains(ps.Message(), "unknown service") {
		return fmt.Errorf("%w: %s is a leased peer port (it serves the internal Raft service): use the node's client port (--client-addr, 7101 by default)",
			ErrNotClientPort, addr)
	}
	return fmt.Errorf("%w: %s does not serve leased's client API (%s)", ErrNotClientPort, addr, st.Message())
}

// refusedPatience is how long a bounded call goes on while every endpoint is a dead end (refuses
// connections, does not resolve, or is not a client port) and none has answered: long enough for a
// node's listener to come back after a quick restart, short of making a mistyped address wait out the
// whole deadline. Leader elections do not count: nodes in one answer (Unavailable, "no leader").
const refusedPatience = time.Second

// callCauses is what one call learned of each endpoint it tried: the last real failure, in the order the
// endpoints were first tried. A call that fails reports them instead of its deadline.
type callCauses struct {
	start time.Time
	order []string
	last  map[string]error
	// answered: some endpoint answered during the call (a server's answer, even Unavailable).
	answered bool
}

func newCallCauses() *callCauses { return &callCauses{start: time.Now(), last: map[string]error{}} }

// note keeps err as addr's last real failure. An attempt cut short by the call's own deadline says
// nothing about the endpoint and is not kept (unless it is all the call knows of addr).
func (cc *callCauses) note(addr string, err error, callEnded bool) {
	if _, seen := cc.last[addr]; !seen {
		cc.order = append(cc.order, addr)
	} else if callEnded {
		return
	}
	cc.last[addr] = err
	var ce *connectError
	if !errors.As(err, &ce) && !errors.Is(err, ErrNotClientPort) {
		cc.answered = true
	}
}

// ended is the error of a call whose context ended before any attempt succeeded: the caller's
// cancellation as it is, or ErrUnavailable naming each endpoint's failure (and wrapping the deadline).
func (cc *callCauses) ended(ctx context.Context, c *Client) error {
	if errors.Is(ctx.Err(), context.Canceled) {
		return ctx.Err()
	}
	return &unavailableError{causes: cc.withDiscovered(c.endpoints), ctxErr: ctx.Err(),
		why: fmt.Sprintf("gave up after %v", time.Since(cc.start).Round(100*time.Millisecond))}
}

// timedError is an error and when it happened.
type timedError struct {
	err error
	at  time.Time
}

// withDiscovered adds, for the endpoints the call did not try itself, why they failed a leader discovery
// during the call (a call goes only where discovery points, so it may never try a node that is down).
func (cc *callCauses) withDiscovered(e *endpoints) *callCauses {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, ep := range e.cfg.Endpoints {
		if f, ok := e.discoveryFailures[ep]; ok && cc.last[ep] == nil && !f.at.Before(cc.start) {
			cc.order = append(cc.order, ep)
			cc.last[ep] = f.err
		}
	}
	return cc
}

// definitive reports whether err is the cluster's answer to the request (held, not found, invalid...),
// not a failure to get one.
func definitive(err error) bool {
	switch {
	case errors.Is(err, errNotConnected), errors.Is(err, errAttemptTimeout), errors.Is(err, ErrNotClientPort),
		errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return false
	}
	st, ok := status.FromError(err)
	if !ok {
		return true
	}
	switch st.Code() {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return false
	}
	return true
}

// deadEnds reports whether every one of endpoints was tried and is a dead end while none answered, and
// how much of refusedPatience is left before the call should give up.
func (cc *callCauses) deadEnds(endpoints []string) (bool, time.Duration) {
	if cc.answered {
		return false, 0
	}
	for _, ep := range endpoints {
		var ce *connectError
		err := cc.last[ep]
		if !(errors.As(err, &ce) && ce.deadEnd()) && !errors.Is(err, ErrNotClientPort) {
			return false, 0
		}
	}
	return true, refusedPatience - time.Since(cc.start)
}

// String lists each endpoint's last failure: "a: connection refused; b: no answer after 1.667s".
func (cc *callCauses) String() string {
	parts := make([]string, 0, len(cc.order))
	for _, ep := range cc.order {
		parts = append(parts, describeFailure(ep, cc.last[ep]))
	}
	return strings.Join(parts, "; ")
}

// describeFailure says in words how one attempt on addr failed, naming addr once.
func describeFailure(addr string, err error) string {
	var ce *connectError
	switch {
	case errors.As(err, &ce):
		return ce.Error()
	case errors.Is(err, ErrNotClientPort):
		return strings.TrimPrefix(err.Error(), ErrNotClientPort.Error()+": ")
	case errors.Is(err, errAttemptTimeout):
		// "attempt timed out after 1.7s: rpc error: ... context deadline exceeded" says it twice.
		msg := err.Error()
		if i := strings.Index(msg, ": rpc error:"); i >= 0 {
			msg = msg[:i]
		}
		return fmt.Sprintf("%s: %s", addr, strings.Replace(msg, errAttemptTimeout.Error(), "no answer", 1))
	case errors.Is(err, context.DeadlineExceeded), status.Code(err) == codes.DeadlineExceeded:
		// (also the server's side of the same deadline: "context deadline exceeded: stream terminated by
		// RST_STREAM", when the server's timer, started on receipt, fired first)
		return fmt.Sprintf("%s: no answer before the call's deadline", addr)
	}
	msg := fromStatus(err).Error()
	return fmt.Sprintf("%s: %s", addr, strings.TrimPrefix(msg, ErrUnavailable.Error()+": "))
}

// unavailableError is ErrUnavailable for a call that reached no leader: why each endpoint failed, and
// (when the call's context ended it) the context's error, so errors.Is(err, context.DeadlineExceeded)
// holds too without the message saying it. It unwraps to the causes as well (errors.Is(err,
// ErrNotClientPort) holds when an endpoint was a peer port).
type unavailableError struct {
	why    string // "gave up after 5s", "retry budget exhausted", or "" when every endpoint is a dead end
	causes *callCauses
	ctxErr error
}

func (e *unavailableError) Error() string {
	msg := ErrUnavailable.Error()
	if s := e.causes.String(); s != "" {
		msg += ": " + s
	}
	if e.why != "" {
		msg += " (" + e.why + ")"
	}
	return msg
}

func (e *unavailableError) Unwrap() []error {
	errs := []error{ErrUnavailable}
	if e.ctxErr != nil {
		errs = append(errs, e.ctxErr)
	}
	for _, ep := range e.causes.order {
		errs = append(errs, e.causes.last[ep])
	}
	return errs
}
