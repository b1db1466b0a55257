package transport

import (
	"bufio"
	"crypto/tls"
	"errors"
	"net"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/wirepb"
)

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
