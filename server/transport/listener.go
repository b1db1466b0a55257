package transport

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/wirepb"
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

// serveLink receives one sender's link (wire.go) until it ends: it answers the hello, checks every batch
// (deliver) before raft sees it, answers pings, and refuses a bad link with an
// end frame saying why. Frames are read and processed on this goroutine, so a Raft.Process that blocks
// holds the sender back through TCP. Close of the Transport closes the connection, which ends the read.
func (t *Transport) serveLink(c net.Conn) {
	defer c.Close()
	member, err := t.connMember(c)
	if err != nil {
		t.stats.rejected.Add(1)
		refuseLink(c, err)
		return
	}
	if _, err := c.Write([]byte(linkHello)); err != nil {
		return
	}

	fr := &frameReader{r: bufio.NewReaderSize(c, 32<<10), limit: t.cfg.MaxMsgBytes}
	// The sender pings every KeepAliveTime; a link silent for twice that and a timeout is dead (a peer
	// gone without a FIN), and its goroutine and connection are freed.
	idle := 2*t.cfg.KeepAliveTime + t.cfg.KeepAliveTimeout
	var armed time.Time
	var from uint64 // the sender of the link's first checked batch
	for {
		if now := time.Now(); now.Sub(armed) > idle/4 {
			_ = c.SetReadDeadline(now.Add(idle))
			armed = now
		}
		kind, payload, err := fr.next()
		if err != nil {
			if errors.Is(err, errFrameTooLarge) {
				t.stats.rejected.Add(1)
				refuseLink(c, status.Error(codes.ResourceExhausted, err.Error()))
				return
			}
			t.streamLost(from) // no bye: the sender's process or connection died
			return
		}
		switch kind {
		case frameBatch:
			b := &wirepb.RaftBatch{}
			if err := proto.Unmarshal(payload, b); err != nil {
				t.stats.rejected.Add(1)
				refuseLink(c, status.Errorf(codes.InvalidArgument, "undecodable batch: %v", err))
				return
			}
			// Process runs on this goroutine, so nothing of the link's outlives it: the Transport's
			// context is the only one its calls need.
			if err := t.deliver(t.ctx, b, member); err != nil {
				if t.ctx.Err() == nil {
					refuseLink(c, err)
				}
				return
			}
			if from == 0 {
				from = b.GetFrom()
				t.heardFrom(from)
			}
		case framePing:
			if _, err := c.Write(appendFrame(nil, framePong, nil)); err != nil {
				t.streamLost(from)
				return
			}
		case frameEnd:
			return // the sender's bye
		default:
			t.stats.rejected.Add(1)
			refuseLink(c, status.Errorf(codes.InvalidArgument, "unknown frame kind %d", kind))
			return
		}
	}
}

// connMember is the raft id of the member on the other end of a link (0 without TLS: nothing to check).
func (t *Transport) connMember(c net.Conn) (uint64, error) {
	if t.cfg.TLS == nil {
		return 0, nil
	}
	tc, ok := c.(*tls.Conn)
	if !ok {
		return 0, status.Error(codes.Unauthenticated, "the peer port requires a verified member certificate")
	}
	return t.memberOfState(tc.ConnectionState())
}

// refuseLink tells the sender why its link ends: an end frame with err's status, then a half-close and a
// short wait for the sender to close its side, so the frame is not lost to a reset (closing a socket with
// unread bytes in it resets the connection).
func refuseLink(c net.Conn, err error) {
	st, _ := proto.Marshal(status.Convert(err).Proto())
	_ = c.SetDeadline(time.Now().Add(refuseLinger))
	if _, err := c.Write(appendFrame(nil, frameEnd, st)); err != nil {
		return
	}
	if hc, ok := c.(interface{ CloseWrite() error }); ok {
		_ = hc.CloseWrite()
	}
	var sink [512]byte
	for {
		if _, err := c.Read(sink[:]); err != nil {
			return
		}
	}
}

// refuseLinger bounds how long a refused link waits for the sender to hang up.
const refuseLinger = time.Second
