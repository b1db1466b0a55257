package rpc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/leased/leased/api/leasepb"
	leasegw "github.com/leased/leased/api/leasepb/gw"
	"github.com/leased/leased/server/tlsfiles"
)

// The HTTP/JSON API (docs/http.md). The grpc-gateway handlers generated from the google.api.http
// annotations of leases.proto (api/leasepb/gw) call the Leases service in-process: there is
// no loopback connection, so there is nothing to spoof. Each request's context carries the HTTP
// connection's TLS state as a gRPC peer, exactly as a gRPC connection's does, so Authorizer.Identity
// (internal/auth) reads the identity of both with one rule, and every ACL check of the gRPC path applies unchanged.
//
// Streaming RPCs (KeepAlive, Watch) have no HTTP route: grpc-gateway's in-process handlers do not
// support them. HTTP clients renew with POST /v1/leases/renew.

// gatewayGrace is how long shutdown lets in-flight HTTP requests finish before it cancels them (an
// Acquire with wait=true never finishes by itself).
const gatewayGrace = 2 * time.Second

// Gateway serves the HTTP/JSON API on Config.HTTPAddr.
type Gateway struct {
	lis    net.Listener
	srv    *http.Server
	log    *slog.Logger
	cancel context.CancelFunc // ends the requests still running after gatewayGrace

	mu       sync.Mutex
	closed   bool
	inflight sync.WaitGroup // the requests in a handler: they call into the node
}

// NewGateway prepares the HTTP/JSON API of leases on lis, over TLS when tlsCfg is set (the client
// port's configuration: same certificates, same client certificate rule).
func NewGateway(log *slog.Logger, limits Limits, leases leasepb.LeasesServer, lis net.Listener, tlsCfg *tls.Config) (*Gateway, error) {
	mux := runtime.NewServeMux(
		runtime.WithMarshalerOption(runtime.MIMEWildcard, &gatewayJSON{runtime.JSONPb{
			// Every field, zero or not, so that clients in any language see the whole message. Unknown
			// fields are refused (400): a misspelt field must not be silently ignored.
			MarshalOptions:   protojson.MarshalOptions{EmitUnpopulated: true},
			UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false},
		}}),
		runtime.WithErrorHandler(writeStatus),
		runtime.WithRoutingErrorHandler(writeRoutingError),
	)
	if err := leasegw.RegisterLeasesHandlerServer(context.Background(), mux, leases); err != nil {
		return nil, fmt.Errorf("register http gateway: %w", err)
	}
	if tlsCfg != nil {
		lis = tls.NewListener(lis, http1TLS(tlsCfg))
	}
	base, cancel := context.WithCancel(context.Background())
	g := &Gateway{lis: lis, cancel: cancel, log: log}
	// The TLS handshake and a request's header within HandshakeTimeout; an idle keep-alive connection is
	// closed like an idle gRPC one (--max-connection-idle, connlimit.go).
	g.srv = &http.Server{
		Handler:           g.handler(mux, int64(limits.MaxRequestBytes)),
		ReadHeaderTimeout: min(HandshakeTimeout, limits.MaxConnectionIdle),
		IdleTimeout:       limits.MaxConnectionIdle,
		MaxHeaderBytes:    64 << 10,
		BaseContext:       func(net.Listener) context.Context { return base },
		// Failed handshakes and malformed requests, at Debug: anyone who reaches the port can cause them.
		ErrorLog: slog.NewLogLogger(log.With("component", "http").Handler(), slog.LevelDebug),
	}
	return g, nil
}

// http1TLS is the client port's TLS configuration offering HTTP/1.1 by ALPN (the gRPC port offers h2).
// Certificates and the client certificate rule stay whatever tlsCfg decides per handshake, so rotated
// certificates apply here too.
func http1TLS(tlsCfg *tls.Config) *tls.Config {
	return tlsfiles.WithALPN(tlsCfg, "http/1.1")
}

// handler answers /healthz itself, refuses a method the path is not served with (405), admits a request
// (none after close), bounds its body at the gRPC port's message limit and hands the connection's
// identity to the service as a gRPC peer.
func (g *Gateway) handler(mux http.Handler, maxBody int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			serveHealthz(w, r)
			return
		}
		if allow := allowedMethod(r.URL.Path); allow != "" && r.Method != allow {
			writeRoutingError(r.Context(), nil, nil, w, r, http.StatusMethodNotAllowed)
			return
		}
		if !g.enter() {
			writeHTTPStatus(w, http.StatusServiceUnavailable, status.New(codes.Unavailable, "server stopping"))
			return
		}
		defer g.inflight.Done()
		if r.ContentLength > maxBody {
			writeHTTPStatus(w, http.StatusRequestEntityTooLarge, status.Newf(codes.InvalidArgument,
				"request body of %d bytes exceeds the %d-byte limit (--max-request-bytes)", r.ContentLength, maxBody))
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		mux.ServeHTTP(w, r.WithContext(peer.NewContext(r.Context(), httpPeer(r))))
	})
}

// httpPeer is the gRPC peer of an HTTP request: its remote address and, over TLS, the connection state
// (with the verified client certificate chains) in the form gRPC's TLS credentials give it.
func httpPeer(r *http.Request) *peer.Peer {
	p := &peer.Peer{Addr: remoteAddr(r.RemoteAddr)}
	if r.TLS != nil {
		p.AuthInfo = credentials.TLSInfo{State: *r.TLS,
			CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}}
	}
	return p
}

// remoteAddr is an HTTP request's RemoteAddr as a net.Addr.
type remoteAddr string

func (a remoteAddr) Network() string { return "tcp" }
func (a remoteAddr) String() string  { return string(a) }

func (g *Gateway) enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.inflight.Add(1)
	return true
}

func (g *Gateway) Serve() {
	if err := g.srv.Serve(g.lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
		// The listener failed; the gRPC port goes on serving.
		g.log.Error("http gateway stopped serving", "err", err)
	}
}

// Close stops accepting, lets in-flight requests finish for gatewayGrace, then cancels the rest, and
// returns once no request is in a handler.
func (g *Gateway) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), gatewayGrace)
	defer cancel()
	if err := g.srv.Shutdown(ctx); err != nil {
		g.cancel()
		_ = g.srv.Close()
	}
	g.cancel()
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	g.inflight.Wait()
}

// httpStatusOf is the HTTP status of a gRPC code (docs/http.md, "Errors"). It differs from
// grpc-gateway's default in one place: FAILED_PRECONDITION, which leased answers when a resource is
// held, is 409 Conflict rather than 400.
func httpStatusOf(c codes.Code) int {
	switch c {
	case codes.OK:
		return http.StatusOK
	case codes.InvalidArgument, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.FailedPrecondition, codes.Aborted, codes.AlreadyExists:
		return http.StatusConflict
	case codes.NotFound:
		return http.StatusNotFound
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	case codes.Canceled:
		return 499 // the client went away (nginx's convention, as grpc-gateway's)
	case codes.Unimplemented:
		return http.StatusNotImplemented
	default:
		return http.StatusInternalServerError
	}
}

// statusJSON encodes error bodies: google.rpc.Status with every field, details as typed JSON objects.
var statusJSON = protojson.MarshalOptions{EmitUnpopulated: true}

// writeStatus is the gateway's error handler: the gRPC status as JSON (code, message, details), with the
// HTTP status httpStatusOf gives its code.
func writeStatus(_ context.Context, _ *runtime.ServeMux, _ runtime.Marshaler, w http.ResponseWriter, _ *http.Request, err error) {
	st := status.Convert(err)
	writeHTTPStatus(w, httpStatusOf(st.Code()), st)
}

// writeRoutingError answers a request no route matches: 404 for an unknown path, 405 for a known path
// with another method, in the same JSON form.
func writeRoutingError(_ context.Context, _ *runtime.ServeMux, _ runtime.Marshaler, w http.ResponseWriter, r *http.Request, httpStatus int) {
	code := codes.NotFound
	msg := fmt.Sprintf("no route %s %s (docs/http.md lists the routes)", r.Method, r.URL.Path)
	switch httpStatus {
	case http.StatusMethodNotAllowed:
		if allow := allowedMethod(r.URL.Path); allow != "" {
			w.Header().Set("Allow", allow)
		}
		code, msg = codes.Unimplemented, fmt.Sprintf("method %s is not allowed on %s (docs/http.md lists the routes)", r.Method, r.URL.Path)
	case http.StatusBadRequest:
		code, msg = codes.InvalidArgument, fmt.Sprintf("malformed request path %s", r.URL.Path)
	}
	writeHTTPStatus(w, httpStatus, status.New(code, msg))
}

// serveHealthz answers GET /healthz with 200 while the process serves, as the admin port's /healthz: it
// asks nothing of the node, so a liveness probe never waits on the raft loop.
func serveHealthz(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeHTTPStatus(w, http.StatusMethodNotAllowed, status.Newf(codes.Unimplemented, "method %s is not allowed on /healthz", r.Method))
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintln(w, "ok")
}

func writeHTTPStatus(w http.ResponseWriter, httpStatus int, st *status.Status) {
	body, err := statusJSON.Marshal(st.Proto())
	if err != nil { // a detail of an unknown type: keep code and message
		body, _ = statusJSON.Marshal(status.New(st.Code(), st.Message()).Proto())
	}
	if hex, err := hexIDs(body); err == nil { // LeaderHint's leaderId
		body = hex
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(httpStatus)
	_, _ = w.Write(body)
}
