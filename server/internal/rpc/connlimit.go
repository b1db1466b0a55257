package rpc

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The connection limit of the client and HTTP ports (--max-connections, decision 14). Every connection
// holds a file descriptor; without a bound, enough silent clients take the node to its descriptor limit,
// after which it can accept nothing — not a client, not a health check, not a peer. ConnGate counts the
// connections both ports hold, together, and closes one more the moment it is accepted: the client gets a
// fast error (a reset) and tries another node or later, instead of waiting in the kernel's accept queue
// as behind a listener that stops accepting (x/net/netutil.LimitListener), where it would hold a
// connection attempt open until its own timeout and learn nothing. The admin and peer ports do not count,
// and the default leaves descriptors for them, so /readyz, /healthz and raft go on at the limit.
//
// Idle connections are closed (Limits.MaxConnectionIdle): by gRPC's MaxConnectionIdle, and the HTTP
// server's IdleTimeout, once no call is open; a connection that never completes its TLS and HTTP/2
// handshake by the handshake timeout.

// HandshakeTimeout bounds the TLS and HTTP/2 (or first HTTP request's header) exchange of a new
// connection; gRPC's own default, 120 s, lets a silent connection hold a slot for two minutes.
const HandshakeTimeout = 10 * time.Second

// Bounds of the default --max-connections: the descriptors left for everything else (peer links, the raft
// log's and snapshots' files, the admin and gossip ports), and the most the default allows whatever the
// descriptor limit (an idle gRPC connection costs about 100 KB: buffers and goroutines).
const (
	reservedDescriptors   = 256
	maxDefaultConnections = 16384
)

// DefaultMaxConnections sizes --max-connections to the process's descriptor limit (RLIMIT_NOFILE, which
// Go raises to the hard limit at start): three quarters of it, less reservedDescriptors, at least 64 and
// at most maxDefaultConnections.
func DefaultMaxConnections() int {
	return connectionsFor(descriptorLimit())
}

func connectionsFor(nofile uint64) int {
	n := int64(min(nofile, 1<<30)*3/4) - reservedDescriptors
	return int(min(max(n, 64), maxDefaultConnections))
}

// ConnGate bounds the connections its listeners hold together.
type ConnGate struct {
	max     int64
	open    atomic.Int64
	refused atomic.Uint64
}

// NewConnGate makes a gate of max connections and registers its metrics on reg (nil: nowhere).
func NewConnGate(max int, reg prometheus.Registerer) *ConnGate {
	g := &ConnGate{max: int64(max)}
	if reg != nil {
		reg.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "leased_connections",
				Help: "Connections open on the client and HTTP ports (bounded by --max-connections)."},
				func() float64 { return float64(g.open.Load()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "leased_connections_refused_total",
				Help: "Connections to the client and HTTP ports closed on accept because --max-connections were open."},
				func() float64 { return float64(g.refused.Load()) }),
		)
	}
	return g
}

// Listener wraps l so that its connections count against the gate.
func (g *ConnGate) Listener(l net.Listener) net.Listener {
	if l == nil {
		return nil
	}
	return &gatedListener{Listener: l, gate: g}
}

type gatedListener struct {
	net.Listener
	gate *ConnGate
}

// Accept returns the next connection within the limit, closing at once those beyond it.
func (l *gatedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.gate.open.Add(1) <= l.gate.max {
			return &gatedConn{Conn: c, gate: l.gate}, nil
		}
		l.gate.open.Add(-1)
		l.gate.refused.Add(1)
		refuse(c)
	}
}

// refuse closes a connection beyond the limit with a reset, so the client learns at once and the node
// keeps no TIME_WAIT state for it.
func refuse(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// gatedConn gives its slot back when closed (once, however often Close is called). It hides the
// *net.TCPConn from gRPC, which then sets no TCP_USER_TIMEOUT on the socket; its keepalive
// (KeepAliveTime + KeepAliveTimeout) still closes the connection of a client that vanished.
type gatedConn struct {
	net.Conn
	gate *ConnGate
	once sync.Once
}

func (c *gatedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.gate.open.Add(-1) })
	return err
}
