package chaos

import (
	"context"
	"net"
	"sync"

	"google.golang.org/grpc"
)

// clientNet is the client side of the fault layer: every SDK client of the workload dials the nodes
// through it (client.Config.DialOptions carries its dialer), so the harness knows the link
// (client name, node) of every connection — including connections to the leader the SDK learnt from an
// answer's leader hint, which names the node's own client address.
//
// A black-holed link drops nothing and resets nothing: bytes written on it are held, bytes arriving on
// it are held, and new connections hang in the dial (like a SYN that is never answered), until the link
// heals, when everything held flows on, as after TCP retransmissions. A black hole of a few seconds is
// therefore what a client sees when a router silently stops forwarding: its connection stays
// ESTABLISHED, writes succeed into the socket buffer, and no answer comes.
type clientNet struct {
	nodes map[string]int // client address -> node index

	mu    sync.Mutex
	holes map[clientLink]chan struct{} // closed when the black hole heals
}

type clientLink struct {
	client string
	node   int
}

func newClientNet(endpoints []string) *clientNet {
	n := &clientNet{nodes: map[string]int{}, holes: map[clientLink]chan struct{}{}}
	for i, ep := range endpoints {
		n.nodes[ep] = i
	}
	return n
}

// dialOption is the grpc dialer of client name.
func (n *clientNet) dialOption(name string) grpc.DialOption {
	return grpc.WithContextDialer((&holeDialer{cn: n, name: name}).dial)
}

// holeDialer dials for one client: it waits while the link to the node is black-holed.
type holeDialer struct {
	cn   *clientNet
	name string
}

func (h *holeDialer) dial(ctx context.Context, addr string) (net.Conn, error) {
	node, ok := h.cn.nodes[addr]
	if !ok {
		node = -1
	}
	lk := clientLink{h.name, node}
	if err := h.cn.wait(ctx, lk); err != nil {
		return nil, err
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &holeConn{Conn: c, net: h.cn, lk: lk, closed: make(chan struct{})}, nil
}

// gate returns the channel to wait on while lk is black-holed (nil when it is not).
func (n *clientNet) gate(lk clientLink) chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.holes[lk]
}

func (n *clientNet) wait(ctx context.Context, lk clientLink) error {
	for {
		g := n.gate(lk)
		if g == nil {
			return nil
		}
		select {
		case <-g:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// blackhole black-holes the links of clients to node.
func (n *clientNet) blackhole(node int, clients ...string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, c := range clients {
		lk := clientLink{c, node}
		if n.holes[lk] == nil {
			n.holes[lk] = make(chan struct{})
		}
	}
}

// heal ends every black hole.
func (n *clientNet) heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for lk, g := range n.holes {
		close(g)
		delete(n.holes, lk)
	}
}

// holeConn is a connection of a clientNet link: Read and Write hold their bytes while the link is
// black-holed.
type holeConn struct {
	net.Conn
	net       *clientNet
	lk        clientLink
	closeOnce sync.Once
	closed    chan struct{}
}

// hold blocks while the link is black-holed, until it heals or the connection is closed.
func (c *holeConn) hold() error {
	for {
		g := c.net.gate(c.lk)
		if g == nil {
			return nil
		}
		select {
		case <-g:
		case <-c.closed:
			return net.ErrClosed
		}
	}
}

func (c *holeConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if herr := c.hold(); herr != nil && n == 0 && err == nil {
		err = herr
	}
	return n, err
}

func (c *holeConn) Write(b []byte) (int, error) {
	if err := c.hold(); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

func (c *holeConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// SetDeadline and friends are passed through: a held Read or Write does not honour them (grpc-go sets
// none on established connections).
var _ net.Conn = (*holeConn)(nil)
