package rpc

import (
	"context"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
)

// Per-connection limits on the client port. A client connection is one gRPC transport (one TCP or TLS
// connection, however many streams it multiplexes): connLimiter, a stats.Handler, tags each connection
// as the transport accepts it with its own connCounts, and every RPC's context descends from that tag, so
// a handler finds its connection's counts in its context without a table to clean up: they go when the
// connection's last RPC does. A peer address would not do: many clients share one behind a NAT or a
// proxy, and one client may dial many connections (each is bounded, and --max-watchers bounds the sum).

// connCounts are one client connection's open RPCs and Watch streams.
type connCounts struct {
	streams  atomic.Int64
	watchers atomic.Int64
}

type connKey struct{}

// connOf returns the counts of the connection ctx arrived on; nil outside the client port (tests that
// call handlers directly, forwarded writes on the peer port).
func connOf(ctx context.Context) *connCounts {
	c, _ := ctx.Value(connKey{}).(*connCounts)
	return c
}

// take adds one to a count unless that would pass limit; it reports whether it did.
func take(n *atomic.Int64, limit int) bool {
	if n.Add(1) > int64(limit) {
		n.Add(-1)
		return false
	}
	return true
}

// connLimiter tags connections (stats.Handler) and bounds each one's concurrent RPCs (interceptors).
type connLimiter struct {
	maxStreams int
}

func (c *connLimiter) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return context.WithValue(ctx, connKey{}, new(connCounts))
}
func (c *connLimiter) HandleConn(context.Context, stats.ConnStats) {}
func (c *connLimiter) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context {
	return ctx
}
func (c *connLimiter) HandleRPC(context.Context, stats.RPCStats) {}

// enter counts one RPC on its connection, or refuses it past --max-streams-per-conn; the returned func
// ends it.
func (c *connLimiter) enter(ctx context.Context) (func(), error) {
	return enterCalls(ctx, 1, c.maxStreams)
}

// enterCalls counts n calls on ctx's connection, or none past limit (--max-streams-per-conn); the
// returned func ends them. The writes of a Writes request count as calls of their own (beyond the
// stream's call itself), so the bound stays one on the writes a connection has in flight, however they
// travel.
func enterCalls(ctx context.Context, n, limit int) (func(), error) {
	cc := connOf(ctx)
	if cc == nil || n == 0 {
		return func() {}, nil
	}
	if cc.streams.Add(int64(n)) > int64(limit) {
		cc.streams.Add(-int64(n))
		return nil, limited("--max-streams-per-conn", "this connection has %d calls open, the most it may (a Writes request's writes count one each)", limit)
	}
	return func() { cc.streams.Add(-int64(n)) }, nil
}

func (c *connLimiter) unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	leave, err := c.enter(ctx)
	if err != nil {
		return nil, ToStatus(err, Hint{})
	}
	defer leave()
	return handler(ctx, req)
}

func (c *connLimiter) stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	leave, err := c.enter(ss.Context())
	if err != nil {
		return ToStatus(err, Hint{})
	}
	defer leave()
	return handler(srv, ss)
}

// options installs the limiter on a gRPC server. The transport itself refuses streams past twice the
// limit (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS, RST_STREAM REFUSED_STREAM): a hard bound for a client
// that ignores the refusals, while those below it get the limiter's ResourceExhausted that names the flag.
func (c *connLimiter) options() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.StatsHandler(c),
		grpc.MaxConcurrentStreams(uint32(min(2*c.maxStreams, 1<<31))),
		grpc.ChainUnaryInterceptor(c.unary),
		grpc.ChainStreamInterceptor(c.stream),
	}
}

// ConnLimits are the client port's gRPC options that bound each connection's concurrent calls at
// maxStreams (--max-streams-per-conn) and tag its connections for the per-connection limits.
func ConnLimits(maxStreams int) []grpc.ServerOption {
	return (&connLimiter{maxStreams: maxStreams}).options()
}
