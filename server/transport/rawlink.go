package transport

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	spb "google.golang.org/genproto/googleapis/rpc/status"
)

// rawLink is an open link to the peer (wire.go): the connection and the goroutine that reads what the
// receiver says (pongs, a refusal). Only the peer's goroutine writes to it (send, keepalive, close).
type rawLink struct {
	t      *Transport
	conn   net.Conn
	opened time.Time

	buf    []byte // frame scratch
	failed bool   // a write failed (part of a frame may be on the wire): no bye

	pongs atomic.Uint64 // pongs received
	// Owned by the peer goroutine (keepalive): whether a ping is out, and the pong count when it left.
	pinged      bool
	pongsAtPing uint64
	killed      error         // why keepalive closed the link; read after ended is closed
	ended       chan struct{} // closed when the reader returns
	err         error         // how the link ended; read only after ended is closed

	// The peer's stop must end a write blocked on a peer that does not read, yet leave a healthy link
	// able to say bye. So a stop (stopWrites) sets a past deadline only while a data write runs, and
	// no data write starts after it; deadMu makes each of those steps atomic with the deadline it sets.
	deadMu    sync.Mutex
	writing   bool // a data write (batch or ping) is in progress; under deadMu
	stopped   bool // the peer stopped: no more data writes; under deadMu
	unwatch   func() bool
	closeOnce sync.Once
}

// minWriteRate sets the deadline of the peer goroutine's writes: KeepAliveTime + KeepAliveTimeout, plus
// the time the frame takes at this rate (a snapshot of 256 MiB may take 17 minutes). A peer that reads
// slower than that, or not at all, loses the link.
const minWriteRate = 256 << 10 // bytes a second

// newRawLink starts the link on c. When ctx (the peer's) ends, a write blocked on a peer that does not
// read returns at once (stopWrites).
func newRawLink(ctx context.Context, t *Transport, c net.Conn) *rawLink {
	l := &rawLink{t: t, conn: c, opened: time.Now(), ended: make(chan struct{})}
	l.unwatch = context.AfterFunc(ctx, l.stopWrites)
	go l.read()
	return l
}

// stopWrites ends a data write in progress (a deadline in the past) and refuses later ones.
func (l *rawLink) stopWrites() {
	l.deadMu.Lock()
	defer l.deadMu.Unlock()
	l.stopped = true
	if l.writing {
		_ = l.conn.SetWriteDeadline(time.Unix(1, 0))
	}
}

// write writes b within timeout, unless the peer stopped.
func (l *rawLink) write(b []byte, timeout time.Duration) error {
	l.deadMu.Lock()
	if l.stopped {
		l.deadMu.Unlock()
		return errPeerStopped
	}
	l.writing = true
	_ = l.conn.SetWriteDeadline(time.Now().Add(timeout))
	l.deadMu.Unlock()
	_, err := l.conn.Write(b)
	l.deadMu.Lock()
	l.writing = false
	l.deadMu.Unlock()
	return err
}

var errPeerStopped = errors.New("the peer was stopped")

// read reads the receiver's frames until the link ends: a pong counts, an end frame is the receiver's
// refusal and says why.
func (l *rawLink) read() {
	defer close(l.ended)
	fr := &frameReader{r: bufio.NewReaderSize(l.conn, 4<<10), limit: 64 << 10}
	for {
		kind, payload, err := fr.next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("peer closed the link")
			}
			l.err = err
			return
		}
		switch kind {
		case framePong:
			l.pongs.Add(1)
		case frameEnd:
			st := &spb.Status{}
			if err := proto.Unmarshal(payload, st); err != nil {
				l.err = fmt.Errorf("peer ended the link with an undecodable status: %w", err)
			} else {
				l.err = status.ErrorProto(st)
			}
			_ = l.conn.Close()
			return
		default:
			l.err = fmt.Errorf("peer sent unknown frame kind %d", kind)
			_ = l.conn.Close()
			return
		}
	}
}

func (l *rawLink) broken() bool { return isClosed(l.ended) }

// isClosed reports whether ch is closed, without waiting.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// send writes msgs as one batch frame, within a deadline that grows with the frame's size. A failed
// write may have left part of a frame on the wire, so it closes the link; the error is the receiver's
// refusal when one arrived.
func (l *rawLink) send(msgs []*raftpb.Message) error {
	cfg := &l.t.cfg
	var err error
	if l.buf, err = appendBatchFrame(l.buf[:0], cfg.ClusterID, cfg.LocalID, msgs[0].GetTo(), msgs); err != nil {
		return err
	}
	timeout := cfg.KeepAliveTime + cfg.KeepAliveTimeout + time.Duration(len(l.buf)/minWriteRate)*time.Second
	err = l.write(l.buf, timeout)
	if cap(l.buf) > reuseBytes {
		l.buf = nil // a snapshot's buffer is not kept for heartbeats
	}
	if err != nil {
		return l.fail(err)
	}
	return nil
}

// fail closes the link after a failed write and returns the better account of why.
func (l *rawLink) fail(err error) error {
	l.failed = true
	_ = l.conn.Close()
	<-l.ended
	if st, ok := status.FromError(l.err); ok && l.err != nil {
		return st.Err()
	}
	return err
}

// keepalive runs every KeepAliveTime on the peer goroutine: it closes a link whose last ping went
// unanswered (a peer that stopped reading, a link into a black hole: TCP alone would take many minutes to
// give up), and pings again.
func (l *rawLink) keepalive() {
	if l.pinged && l.pongs.Load() == l.pongsAtPing {
		l.killed = fmt.Errorf("no answer to a keepalive ping within %v", l.t.cfg.KeepAliveTime)
		l.failed = true // no bye on a link given up
		_ = l.conn.Close()
		return
	}
	l.pinged, l.pongsAtPing = true, l.pongs.Load()
	if err := l.write(appendFrame(nil, framePing, nil), l.t.cfg.KeepAliveTimeout); err != nil {
		_ = l.fail(err)
	}
}

// close says bye (so the receiver knows the end is deliberate, not a crash: Config.OnStreamLost), closes
// the connection, waits for the reader and returns how the link ended.
func (l *rawLink) close() error {
	l.closeOnce.Do(func() {
		l.unwatch()
		if !l.failed && !l.broken() {
			// Not l.write: the bye is written after the peer stopped, and stopWrites, which ran or will
			// run once, sets a deadline only during a data write.
			l.deadMu.Lock()
			_ = l.conn.SetWriteDeadline(time.Now().Add(byeTimeout))
			l.deadMu.Unlock()
			_, _ = l.conn.Write(appendFrame(nil, frameEnd, nil))
		}
		_ = l.conn.Close()
	})
	<-l.ended
	if l.killed != nil {
		return l.killed
	}
	return l.err
}

// byeTimeout bounds the bye's write: a healthy socket takes it at once, and a full one is not worth
// waiting for (the receiver then reports the link lost, a hint it can afford to get wrong).
const byeTimeout = 50 * time.Millisecond

// dialLink opens a link to the peer within DialTimeout: TCP (through the proxy the environment names, as
// gRPC dials), TLS when configured, and the hello both ways.
func (p *peer) dialLink() (*rawLink, error) {
	ctx, cancel := context.WithTimeout(p.ctx, p.t.cfg.DialTimeout)
	defer cancel()
	tcp, err := dialPeer(ctx, p.addr, p.t.proxy)
	if err != nil {
		return nil, err
	}
	c, err := p.handshake(ctx, tcp)
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	return newRawLink(p.ctx, p.t, c), nil
}

// handshake runs TLS, if configured, and the hello exchange on tcp. It returns the connection to go on
// with (the TLS one, or tcp), which the caller closes on error.
func (p *peer) handshake(ctx context.Context, tcp net.Conn) (net.Conn, error) {
	// Deadlines on tcp bound the TLS layer's reads and writes too.
	deadline, _ := ctx.Deadline()
	_ = tcp.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = tcp.SetDeadline(time.Now()) }) // the peer stopped
	defer stop()
	c := tcp
	if p.t.cfg.TLS != nil {
		tc := tls.Client(tcp, p.t.linkTLS(p.id, p.addr))
		c = tc
		if err := tc.HandshakeContext(ctx); err != nil {
			return c, err
		}
		if tc.ConnectionState().NegotiatedProtocol != linkALPN {
			return c, errors.New("raft link: the peer did not accept the link's ALPN protocol")
		}
	}
	if _, err := c.Write([]byte(linkHello)); err != nil {
		return c, err
	}
	head := make([]byte, len(linkHello))
	n, err := io.ReadFull(c, head)
	switch {
	case err == nil && string(head) == linkHello:
		return c, tcp.SetDeadline(time.Time{})
	case err == nil || (n > 0 && string(head[:n]) != linkHello[:n]):
		return c, errors.New("raft link: the peer answered the hello with something else")
	default:
		return c, fmt.Errorf("raft link hello: %w", err)
	}
}

// dialPeer connects to addr, through an HTTP CONNECT proxy when proxyFor names one for it. The
// Transport's is http.ProxyFromEnvironment (HTTPS_PROXY, NO_PROXY; loopback and localhost never go
// through one): the rule gRPC follows for the peer connections it dials, so links and gRPC take the same
// path.
func dialPeer(ctx context.Context, addr string, proxyFor func(*http.Request) (*url.URL, error)) (net.Conn, error) {
	var d net.Dialer
	proxy, err := proxyFor(&http.Request{URL: &url.URL{Scheme: "https", Host: addr}})
	if err != nil || proxy == nil {
		return d.DialContext(ctx, "tcp", addr)
	}
	c, err := d.DialContext(ctx, "tcp", proxy.Host)
	if err != nil {
		return nil, fmt.Errorf("dial proxy %s: %w", proxy.Host, err)
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	req := &http.Request{Method: http.MethodConnect, URL: &url.URL{Host: addr}, Host: addr, Header: http.Header{}}
	if u := proxy.User; u != nil {
		pw, _ := u.Password()
		req.Header.Set("Proxy-Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(u.Username()+":"+pw)))
	}
	br := bufio.NewReader(c)
	err = req.Write(c)
	var resp *http.Response
	if err == nil {
		resp, err = http.ReadResponse(br, req)
	}
	if err == nil {
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("proxy %s answered CONNECT %s with %s", proxy.Host, addr, resp.Status)
		}
	}
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	if br.Buffered() > 0 {
		head, _ := br.Peek(br.Buffered())
		return &replayConn{Conn: c, head: head}, nil
	}
	return c, nil
}
