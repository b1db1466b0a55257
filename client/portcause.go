package client

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
)

// An endpoint that is not a client port, or that speaks TLS when the client does not (or the reverse),
// used to look like any failed connection: gRPC retries it quietly until the call's deadline. The first
// bytes the server sends say which it is: an HTTP/1.1 status line (leased's HTTP/JSON API or admin port
// answering gRPC's HTTP/2 preface), a TLS record (a TLS port), or nothing at all before the server
// closes (a TLS gRPC port drops a plaintext client without a word; a plaintext port drops a TLS
// ClientHello). sniffConn reads them on the raw TCP connection and keeps what they mean as the
// connection's cause, so that the call names the right port or flag at once.

// portError is an endpoint that will answer the same way every time: a dead end, ErrNotClientPort.
type portError struct{ hint string }

func (e *portError) Error() string        { return e.hint }
func (e *portError) Is(target error) bool { return target == ErrNotClientPort }

var (
	errHTTPPort = &portError{"answers HTTP/1.1, not gRPC: it is a leased HTTP/JSON API or admin port " +
		"(--http-addr, --admin-addr); use the node's client port (--client-addr, 7101 by default)"}
	errTLSPort = &portError{"speaks TLS: connect with TLS (leasectl --cacert, and --cert and --key if the " +
		"cluster requires client certificates; Config.TLS in the SDK)"}
	errSilentClose = &portError{"closed the connection without answering, as a TLS port does to a plaintext " +
		"client: if the cluster serves TLS, connect with TLS (leasectl --cacert; Config.TLS in the SDK)"}
	// errNoTLSAnswer: the server closed the connection during the client's TLS handshake.
	errNoTLSAnswer = errors.New("the server closed the connection without a TLS answer")
)

// sniffConn records what the first bytes the server sends (or its closing before any) say.
type sniffConn struct {
	net.Conn
	cause   *connCause
	withTLS bool
	once    sync.Once
}

func (s *sniffConn) Read(b []byte) (int, error) {
	n, err := s.Conn.Read(b)
	if n > 0 || err != nil {
		s.once.Do(func() { s.sniff(b[:n], err) })
	}
	return n, err
}

func (s *sniffConn) sniff(first []byte, err error) {
	closed := len(first) == 0 && errors.Is(err, io.EOF)
	if s.withTLS {
		// A TLS answer, however bad, is the TLS layer's to describe (tlscause.go).
		if closed {
			s.cause.setTLS(errNoTLSAnswer)
		}
		return
	}
	switch {
	case bytes.HasPrefix(first, []byte("HTTP/")):
		s.cause.setDial(errHTTPPort)
	case len(first) >= 2 && (first[0] == 0x15 || first[0] == 0x16) && first[1] == 0x03: // a TLS alert or handshake record
		s.cause.setDial(errTLSPort)
	case closed:
		s.cause.setDial(errSilentClose)
	}
}
