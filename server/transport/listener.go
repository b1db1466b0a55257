package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/leased/leased/server/tlsfiles"
)

// Listener wraps the peer port's listener so that raft links and gRPC share it: it serves the links
// itself and hands every other connection to the caller, which serves gRPC on it:
//
//	srv := grpc.NewServer(t.ServerOptions()...)
//	t.Register(srv)
//	go srv.Serve(t.Listener(lis))
//
// Without TLS a connection is a link when its first bytes are linkHello; with Config.TLS the listener
// runs the TLS handshake (mutual, member certificates; ServerOptions then expects connections it already
// secured) and a link is a connection that negotiated linkALPN. Each accepted connection is sorted on a
// goroutine of its own within DialTimeout, so a slow or silent one holds up nobody. Closing the listener
// (grpc.Server.Stop does) or the Transport stops accepting; links already open end with the Transport.
func (t *Transport) Listener(lis net.Listener) net.Listener {
	l := &peerListener{Listener: lis, t: t, grpc: make(chan net.Conn), done: make(chan struct{})}
	if t.cfg.TLS != nil {
		l.tls = t.listenerTLS()
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.closed {
		_ = l.Close()
		return l
	}
	t.wg.Add(1)
	go l.acceptLoop()
	return l
}

// peerListener is the net.Listener handed to gRPC: it yields the connections that are not links.
type peerListener struct {
	net.Listener
	t    *Transport
	tls  *tls.Config // nil: plaintext
	grpc chan net.Conn

	done      chan struct{} // closed by Close or when accepting failed
	closeOnce sync.Once
	errMu     sync.Mutex
	err       error // why accepting stopped
}

func (l *peerListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.grpc:
		return c, nil
	case <-l.done:
		l.errMu.Lock()
		defer l.errMu.Unlock()
		return nil, l.err
	}
}

func (l *peerListener) Close() error {
	var err error
	l.closeOnce.Do(func() {
		l.stop(net.ErrClosed)
		err = l.Listener.Close()
	})
	return err
}

// stop records why accepting ended (the first reason wins) and wakes Accept.
func (l *peerListener) stop(err error) {
	l.errMu.Lock()
	defer l.errMu.Unlock()
	select {
	case <-l.done:
	default:
		l.err = err
		close(l.done)
	}
}

// acceptLoop accepts until the listener or the Transport closes, and sorts each connection.
func (l *peerListener) acceptLoop() {
	defer l.t.wg.Done()
	stop := context.AfterFunc(l.t.ctx, func() { _ = l.Close() })
	defer stop()
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue // a temporary failure (too many open files reports itself so); gRPC retries too
			}
			l.stop(err)
			return
		}
		l.t.wg.Add(1)
		go l.sort(c)
	}
}

// sort tells a link from a gRPC connection and hands it on. Links are served on this goroutine.
func (l *peerListener) sort(accepted net.Conn) {
	defer l.t.wg.Done()
	// Closing the accepted connection ends whatever reads or writes it, TLS on top included.
	stop := context.AfterFunc(l.t.ctx, func() { _ = accepted.Close() })
	_ = accepted.SetDeadline(time.Now().Add(l.t.cfg.DialTimeout))
	c, isLink, err := l.identify(accepted)
	if err != nil {
		stop()
		_ = accepted.Close()
		l.t.log.Debug("peer connection refused", "remote", accepted.RemoteAddr().String(), "err", err)
		return
	}
	_ = c.SetDeadline(time.Time{})
	if isLink {
		defer stop()
		l.t.serveLink(c)
		return
	}
	stop()
	select {
	case l.grpc <- c:
	case <-l.done:
		_ = c.Close()
	}
}

// identify runs the TLS handshake, if any, and reads what tells a link from gRPC. It returns the
// connection to go on with: with TLS the secured one; without, one that replays the bytes it read.
func (l *peerListener) identify(c net.Conn) (net.Conn, bool, error) {
	if l.tls != nil {
		tc := tls.Server(c, l.tls)
		if err := tc.Handshake(); err != nil {
			return c, false, err
		}
		if tc.ConnectionState().NegotiatedProtocol != linkALPN {
			return tc, false, nil
		}
		return tc, true, readHello(tc)
	}
	head := make([]byte, len(linkHello))
	n, err := io.ReadFull(c, head)
	if err == nil && string(head) == linkHello {
		return c, true, nil
	}
	if n == 0 && err != nil {
		return c, false, err
	}
	// Not a link: gRPC reads the bytes again. A connection that sent fewer than len(linkHello) bytes
	// before pausing is gRPC's to judge (its preface is longer).
	return &replayConn{Conn: c, head: head[:n]}, false, nil
}

// readHello reads the sender's linkHello on a connection that negotiated linkALPN.
func readHello(c net.Conn) error {
	head := make([]byte, len(linkHello))
	if _, err := io.ReadFull(c, head); err != nil {
		return err
	}
	if string(head) != linkHello {
		return errors.New("raft link: the connection did not start with the link's hello")
	}
	return nil
}

// replayConn is a connection whose first bytes were already read: Read returns them first.
type replayConn struct {
	net.Conn
	head []byte
}

func (c *replayConn) Read(p []byte) (int, error) {
	if len(c.head) > 0 {
		n := copy(p, c.head)
		c.head = c.head[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// listenerTLS is the serving side's TLS: serverTLS, offering linkALPN before gRPC's "h2" (a gRPC client
// offers only "h2", an older node's link dialer never dials).
func (t *Transport) listenerTLS() *tls.Config {
	return tlsfiles.WithALPN(t.serverTLS(), linkALPN, "h2")
}

// securedCreds are the peer gRPC server's credentials with TLS: the Listener already ran the handshake,
// so the server takes the connection as it is and reads its identity from the TLS state.
type securedCreds struct{}

var errNotSecured = errors.New("peer port: a TLS peer server must serve Transport.Listener's connections")

func (securedCreds) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	tc, ok := c.(*tls.Conn)
	if !ok {
		return nil, nil, errNotSecured
	}
	return c, credentials.TLSInfo{
		State:          tc.ConnectionState(),
		CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity},
	}, nil
}

func (securedCreds) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("peer port: securedCreds serve, they do not dial")
}

func (securedCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls"}
}

func (c securedCreds) Clone() credentials.TransportCredentials { return c }

func (securedCreds) OverrideServerName(string) error { return nil }
