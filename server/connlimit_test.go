package server_test

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest"
)

// accepted reports whether the server kept conn (a raw TCP connection to a gRPC port, which answers a
// new connection with its HTTP/2 SETTINGS) rather than closing it on accept; it waits at most 5 s.
func accepted(t *testing.T, conn net.Conn) bool {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := conn.Read(make([]byte, 64))
	var ne net.Error
	if n == 0 && errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("a connection neither answered nor closed within 5 s")
	}
	return n > 0
}

// closedWithin reports whether the server closes conn within d, reading (and discarding) what it sends.
func closedWithin(conn net.Conn, d time.Duration) bool {
	_ = conn.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 4096)
	for {
		if _, err := conn.Read(buf); err != nil {
			var ne net.Error
			return !(errors.As(err, &ne) && ne.Timeout())
		}
	}
}

// dialAll dials n connections to addr and returns those that connected, and how many the server reset
// before the dial returned (closed on accept that fast).
func dialAll(t *testing.T, addr string, n int) (conns []net.Conn, reset int) {
	t.Helper()
	for range n {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if errors.Is(err, syscall.ECONNRESET) {
			reset++
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	t.Cleanup(func() {
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return conns, reset
}

func dialOne(t *testing.T, addr string) net.Conn {
	t.Helper()
	conns, _ := dialAll(t, addr, 1)
	if len(conns) == 0 {
		t.Fatalf("%s reset the connection", addr)
	}
	return conns[0]
}

// TestMaxConnections: past --max-connections, connections to the client and HTTP ports are closed on
// accept, while a client connected before goes on working; closing the flood frees the slots.
func TestMaxConnections(t *testing.T) {
	const limit, flood = 6, 20
	c := servertest.Start(t, 1, func(cfg *server.Config) { cfg.Limits.MaxConnections = limit })
	ctx := ctxT(t)
	existing := c.Leases(0)
	if _, err := acquireRetrying(c, ctx, &leasepb.AcquireRequest{Resource: "c/before", Holder: "h", TtlMs: 60_000}); err != nil {
		t.Fatal(err)
	}
	conns, _ := dialAll(t, c.Endpoints()[0], flood)
	kept := 0
	for _, conn := range conns {
		if accepted(t, conn) {
			kept++
		}
	}
	if kept == 0 || kept >= limit {
		t.Fatalf("%d of %d new connections kept at --max-connections %d (one or more held by the existing client)", kept, flood, limit)
	}
	if _, err := existing.Acquire(ctx, &leasepb.AcquireRequest{Resource: "c/during", Holder: "h", TtlMs: 60_000}); err != nil {
		t.Fatalf("the client connected before the flood: %v", err)
	}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	if resp, err := hc.Get("http://" + c.HTTPAddrs()[0] + "/v1/leases/c/during"); err == nil {
		resp.Body.Close()
		t.Fatalf("the HTTP port answered %s at the limit the client port filled", resp.Status)
	}
	for _, conn := range conns {
		_ = conn.Close()
	}
	eventually(t, 10*time.Second, "the HTTP port serves once the flood is gone", func() bool {
		resp, err := hc.Get("http://" + c.HTTPAddrs()[0] + "/v1/leases/c/during")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// TestIdleConnectionsAreClosed: with --max-connection-idle, a connection that never speaks, a gRPC
// connection with no call open and an HTTP keep-alive connection are each closed once idle that long.
func TestIdleConnectionsAreClosed(t *testing.T) {
	const idle = 300 * time.Millisecond
	c := servertest.Start(t, 1, func(cfg *server.Config) { cfg.Limits.MaxConnectionIdle = idle })
	ctx := ctxT(t)
	if _, err := acquireRetrying(c, ctx, &leasepb.AcquireRequest{Resource: "i/x", Holder: "h", TtlMs: 60_000}); err != nil {
		t.Fatal(err)
	}

	silent := dialOne(t, c.Endpoints()[0])
	if !closedWithin(silent, 5*time.Second) {
		t.Fatal("a connection that never completed its handshake is still open after 5 s")
	}

	conn, err := grpc.NewClient(c.Endpoints()[0], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := leasepb.NewLeasesClient(conn).Get(ctx, &leasepb.GetRequest{Resource: "i/x"}); err != nil {
		t.Fatal(err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for s := conn.GetState(); s == connectivity.Ready; s = conn.GetState() {
		if !conn.WaitForStateChange(waitCtx, s) {
			t.Fatal("an idle gRPC connection is still open after 5 s")
		}
	}

	web := dialOne(t, c.HTTPAddrs()[0])
	if _, err := web.Write([]byte("GET /v1/leases/i/x HTTP/1.1\r\nHost: leased\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	_ = web.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(web), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("keep-alive GET: %s (close %v)", resp.Status, resp.Close)
	}
	if !closedWithin(web, 5*time.Second) {
		t.Fatal("an idle HTTP keep-alive connection is still open after 5 s")
	}
}
