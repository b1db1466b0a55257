package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
)

// TestAdminAnswersAtTheConnectionLimit runs leased with a small --max-connections and fills it with idle
// connections to the client and HTTP ports: one more is closed at once, the client connected before the
// flood still acquires, the admin port's /healthz and /readyz answer, and /metrics counts the refusals.
func TestAdminAnswersAtTheConnectionLimit(t *testing.T) {
	skipShort(t)
	const limit, flood = 8, 24
	addrs := freeAddrs(t, 4)
	peer, admin, client, httpAddr := addrs[0], addrs[1], addrs[2], addrs[3]
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	stderr := &syncBuffer{}
	args := []string{
		"--name=solo", "--data-dir=" + filepath.Join(t.TempDir(), "solo"), "--client-addr=" + client,
		"--peer-addr=" + peer, "--admin-addr=" + admin, "--http-addr=" + httpAddr, "--initial-cluster=solo=" + peer,
		"--election-timeout=50ms", fmt.Sprintf("--max-connections=%d", limit),
	}
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, env(), &bytes.Buffer{}, stderr) }()
	defer func() {
		cancel(errors.New("test stop"))
		if err := <-done; err != nil {
			t.Errorf("shutdown: %v", err)
		}
	}()
	conn, err := grpc.NewClient(client, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	leases := leasepb.NewLeasesClient(conn)
	acquire := func(resource string) error {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		defer ccancel()
		_, err := leases.Acquire(cctx, &leasepb.AcquireRequest{Resource: resource, Holder: "h", TtlMs: 60_000})
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for err = acquire("c/0"); status.Code(err) == codes.Unavailable; err = acquire("c/0") {
		if time.Now().After(deadline) {
			t.Fatalf("no leader: %v\n%s", err, stderr.String())
		}
	}
	if err != nil {
		t.Fatal(err)
	}

	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for i := range flood {
		addr := client
		if i%2 == 1 {
			addr = httpAddr
		}
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if errors.Is(err, syscall.ECONNRESET) {
			continue // past the limit, closed on accept before the dial returned
		}
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		if i < flood-1 {
			continue
		}
		// The last connection is past the limit whichever were kept: it is closed at once.
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
			t.Fatalf("a connection past --max-connections=%d: read %v, want it closed at once", limit, err)
		}
	}
	if got := fetch(t, "http://"+admin+"/healthz"); !strings.HasPrefix(got, "ok") {
		t.Fatalf("/healthz at the limit: %q", got)
	}
	if got := fetch(t, "http://"+admin+"/readyz"); !strings.HasPrefix(got, "ok: leader") {
		t.Fatalf("/readyz at the limit: %q", got)
	}
	if err := acquire("c/1"); err != nil {
		t.Fatalf("the client connected before the flood: %v", err)
	}
	// Every connection is accepted (or refused) soon; then the gauge stands at the limit.
	for deadline := time.Now().Add(5 * time.Second); ; {
		metrics := fetch(t, "http://"+admin+"/metrics")
		if strings.Contains(metrics, fmt.Sprintf("leased_connections %d\n", limit)) && !strings.Contains(metrics, "leased_connections_refused_total 0\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics at the limit does not show %d connections and some refused:\n%s", limit, grepLines(metrics, "leased_connections"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
