package client

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"

	"google.golang.org/grpc/credentials"
)

// A TLS handshake failure never reaches the caller through gRPC: the connection just goes to
// TRANSIENT_FAILURE and the call, retried until its deadline, ends in "context deadline exceeded". The
// client therefore watches its own handshakes and keeps the last TLS failure of each connection (in its
// connCause, cause.go), so that a call that cannot connect says why (ErrUnauthenticated, naming the TLS
// problem), at once.

// watchedCreds are TLS credentials that record handshake failures in cause.
type watchedCreds struct {
	credentials.TransportCredentials
	cause *connCause
}

func (w *watchedCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := w.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil {
		if isTLSFailure(err) {
			w.cause.setTLS(err)
		}
		return nil, nil, err
	}
	// With TLS 1.3 the server verifies the client's certificate after the client's side of the handshake
	// is done: a refusal arrives as an alert on the first read.
	return &alertConn{Conn: conn, cause: w.cause}, info, nil
}

func (w *watchedCreds) Clone() credentials.TransportCredentials {
	return &watchedCreds{TransportCredentials: w.TransportCredentials.Clone(), cause: w.cause}
}

// alertConn records a TLS alert read from the server, and clears the cause once the server has spoken.
type alertConn struct {
	net.Conn
	cause *connCause
	once  sync.Once
}

func (c *alertConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.once.Do(func() { c.cause.setTLS(nil) })
	}
	if err != nil && isTLSFailure(err) {
		c.cause.setTLS(err)
	}
	return n, err
}

// isTLSFailure reports whether err is a TLS or certificate failure, local or an alert from the server.
func isTLSFailure(err error) bool {
	var (
		verify *tls.CertificateVerificationError
		record tls.RecordHeaderError
		alert  tls.AlertError
		op     *net.OpError
	)
	switch {
	case errors.As(err, &verify), errors.As(err, &record), errors.As(err, &alert):
		return true
	case errors.As(err, &op) && op.Op == "remote error":
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "tls: ") || strings.Contains(msg, "x509: ")
}

// tlsProblem describes a TLS failure with addr in words an operator can act on, keeping the cause.
func tlsProblem(addr string, err error) error {
	var unknown x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	var record tls.RecordHeaderError
	msg := err.Error()
	hint := ""
	switch {
	case errors.As(err, &unknown):
		hint = "the server's certificate is not signed by a trusted CA (check --cacert / Config.TLS.RootCAs)"
	case errors.As(err, &hostname):
		hint = "the server's certificate does not name the address dialled"
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired:
		hint = "the server's certificate has expired or is not yet valid"
	case strings.Contains(msg, "certificate required"):
		hint = "the server requires a client certificate signed by a CA it trusts (--cert and --key: none was given, or none from such a CA)"
	case strings.Contains(msg, "expired certificate"):
		hint = "the server refused the client certificate: it has expired"
	case strings.Contains(msg, "bad certificate"), strings.Contains(msg, "unknown certificate authority"):
		hint = "the server refused the client certificate (not signed by a CA it trusts, expired, or not for client use)"
	case errors.Is(err, errNoTLSAnswer):
		hint = "the server does not seem to serve TLS on this port: for a plaintext cluster leave out --cacert, --cert and --key (Config.TLS nil)"
	case errors.As(err, &record) && strings.HasPrefix(string(record.RecordHeader[:]), "HTTP/"):
		hint = "the server answers plaintext HTTP/1.1: it is a leased HTTP/JSON API or admin port without TLS; use the node's client port (--client-addr, 7101 by default)"
	case strings.Contains(msg, "no application protocol"):
		hint = "the server does not serve gRPC (HTTP/2) on this port: it is a leased HTTP/JSON API or admin port; use the node's client port (--client-addr, 7101 by default)"
	case strings.Contains(msg, "first record does not look like a TLS handshake"):
		hint = "the server does not speak TLS on this port: for a plaintext cluster leave out --cacert, --cert and --key (Config.TLS nil)"
	default:
		hint = "the TLS handshake failed"
	}
	return fmt.Errorf("%w: TLS handshake with %s failed: %s: %v", ErrUnauthenticated, addr, hint, err)
}
