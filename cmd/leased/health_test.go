package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/leased/leased/server"
)

type fakeLeader struct{ id atomic.Uint64 }

func (f *fakeLeader) Leader() uint64 { return f.id.Load() }

// readyNode is a node that says whether it is ready, as server.Server does.
type readyNode struct {
	fakeLeader
	err atomic.Pointer[error]
}

func (f *readyNode) Ready() error {
	if p := f.err.Load(); p != nil {
		return *p
	}
	return nil
}

// TestHealthFailsOnAStalledNode: a node that knows a leader but whose raft loop is stalled (its disk
// blocks a write) is not ready: /readyz answers 503 with the reason and `leased health` exits 1.
func TestHealthFailsOnAStalledNode(t *testing.T) {
	node := &readyNode{}
	node.id.Store(7)
	srv := httptest.NewServer((&adminServer{}).handler(node))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	if code, out := healthExit(t, env(), "--admin-addr", addr); code != 0 || !strings.Contains(out, "/readyz: ok: leader") {
		t.Fatalf("ready: exit %d, %q", code, out)
	}
	stalled := fmt.Errorf("%w for 1.5s: raft log save in flight for 1.5s", server.ErrLoopStalled)
	node.err.Store(&stalled)
	if code, out := healthExit(t, env(), "--admin-addr", addr); code != 1 || !strings.Contains(out, "raft loop stalled for 1.5s") {
		t.Fatalf("stalled, leader known: exit %d, %q", code, out)
	}
}

// healthExit runs `leased health args...` in-process and returns its exit code and output.
func healthExit(t *testing.T, getenv func(string) string, args ...string) (int, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), append([]string{"health"}, args...), getenv, &stdout, &stderr)
	code := exitCode(err, &stderr)
	return code, stdout.String() + stderr.String()
}

// TestHealthAsksTheAdminServer runs `leased health` against the real admin handler: exit 0 while the
// node knows a leader, 1 without one, while stopping and when nothing answers; /healthz with --live.
func TestHealthAsksTheAdminServer(t *testing.T) {
	node := &fakeLeader{}
	a := &adminServer{}
	srv := httptest.NewServer(a.handler(node))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	_, port, _ := net.SplitHostPort(addr)

	if code, out := healthExit(t, env(), "--admin-addr", addr); code != 1 || !strings.Contains(out, "no leader") {
		t.Fatalf("no leader: exit %d, %q", code, out)
	}
	if code, out := healthExit(t, env(), "--admin-addr", addr, "--live"); code != 0 || !strings.Contains(out, "/healthz: ok") {
		t.Fatalf("--live without a leader: exit %d, %q", code, out)
	}
	node.id.Store(7)
	if code, out := healthExit(t, env(), "--admin-addr", addr); code != 0 || !strings.Contains(out, "/readyz: ok") {
		t.Fatalf("with a leader: exit %d, %q", code, out)
	}
	// The container's environment: LEASED_ADMIN_ADDR is the listen address, 0.0.0.0 is asked on loopback.
	if code, out := healthExit(t, env("LEASED_ADMIN_ADDR", "0.0.0.0:"+port)); code != 0 {
		t.Fatalf("LEASED_ADMIN_ADDR=0.0.0.0:%s: exit %d, %q", port, code, out)
	}
	a.setStopping()
	if code, out := healthExit(t, env(), "--admin-addr", addr); code != 1 || !strings.Contains(out, "shutting down") {
		t.Fatalf("stopping: exit %d, %q", code, out)
	}
	srv.Close()
	if code, out := healthExit(t, env(), "--admin-addr", addr); code != 1 {
		t.Fatalf("nothing listening: exit %d, %q", code, out)
	}
}

func TestHealthUsage(t *testing.T) {
	for _, args := range [][]string{{"--admin-addr", "nohostport"}, {"--bogus"}, {"extra"}, {"--timeout", "0s"}} {
		if code, out := healthExit(t, env(), args...); code != 2 {
			t.Errorf("health %v: exit %d, %q", args, code, out)
		}
	}
	if code, out := healthExit(t, env(), "--help"); code != 0 || !strings.Contains(out, "Exit status") {
		t.Errorf("health --help: exit %d, %q", code, out)
	}
}
