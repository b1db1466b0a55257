//go:build faultinject

package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server"
)

type stallingNode struct {
	fakeNode
	stall time.Duration
}

func (n *stallingNode) InjectDiskStall(d time.Duration) { n.stall = d }

// TestDiskStallHookContract: the chaos harness's contract for POST /debug/fault/disk-stall.
func TestDiskStallHookContract(t *testing.T) {
	node := &stallingNode{}
	srv := httptest.NewServer((&adminServer{}).handler(node))
	defer srv.Close()
	post := func(query string) (int, string) {
		t.Helper()
		resp, err := http.Post(srv.URL+"/debug/fault/disk-stall"+query, "text/plain", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, body := post("?duration=3s"); code != 200 || node.stall != 3*time.Second || !strings.Contains(body, "3s") {
		t.Errorf("duration=3s: %d %q, stall %v", code, body, node.stall)
	}
	for _, q := range []string{"", "?duration=", "?duration=3", "?duration=soon", "?duration=0s", "?duration=-1s"} {
		node.stall = 0
		if code, body := post(q); code != 400 || node.stall != 0 {
			t.Errorf("%q: %d %q, stall %v; want 400 and no stall", q, code, body, node.stall)
		}
	}
	resp, err := http.Get(srv.URL + "/debug/fault/disk-stall?duration=3s")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: %d, want 405", resp.StatusCode)
	}
}

// TestInjectedDiskStallExitsOne: a one-node leased built with -tags faultinject, told to stall its next
// raft log write beyond --disk-stall-timeout, stops with ErrDiskStalled, which main turns into exit
// status 1.
func TestInjectedDiskStallExitsOne(t *testing.T) {
	skipShort(t)
	err, log := faultedSolo(t, "disk-stall?duration=20s", "--disk-stall-timeout=300ms")
	if !errors.Is(err, server.ErrDiskStalled) || exitCode(err, io.Discard) != 1 {
		t.Fatalf("run returned %v (exit %d), want ErrDiskStalled and exit 1", err, exitCode(err, io.Discard))
	}
	// The stalled write is a Save, which writes the WAL segment (raft.db holds only snapshots).
	if !strings.Contains(log, "raft log write stalled") || !strings.Contains(log, ".wal") {
		t.Errorf("the log does not name the stall and the file:\n%s", log)
	}
}

// faultedSolo runs a one-node leased with extra flags until it leads, injects fault through the admin
// port's /debug/fault/ route, checks that an acquire is not acknowledged, and returns what run returned
// and the node's log.
func faultedSolo(t *testing.T, fault string, extra ...string) (error, string) {
	t.Helper()
	addrs := freeAddrs(t, 3)
	client, peer, admin := addrs[0], addrs[1], addrs[2]
	stderr := &syncBuffer{}
	args := append([]string{
		"--name=solo", "--data-dir=" + filepath.Join(t.TempDir(), "solo"), "--client-addr=" + client,
		"--peer-addr=" + peer, "--admin-addr=" + admin, "--initial-cluster=solo=" + peer, "--election-timeout=100ms",
	}, extra...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, env(), &bytes.Buffer{}, stderr) }()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(stderr.String(), `msg="became leader"`) {
		if time.Now().After(deadline) {
			t.Fatalf("no leader after 10s:\n%s", stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	resp, err := http.Post("http://"+admin+"/debug/fault/"+fault, "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("POST %s: %d", fault, resp.StatusCode)
	}
	conn, err := grpc.NewClient(client, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	actx, acancel := context.WithTimeout(ctx, 5*time.Second)
	defer acancel()
	if _, err := leasepb.NewLeasesClient(conn).Acquire(actx, &leasepb.AcquireRequest{Resource: "r", Holder: "h", TtlMs: 60_000}); err == nil {
		t.Fatalf("a write was acknowledged after %s", fault)
	}
	select {
	case err := <-done:
		return err, stderr.String()
	case <-time.After(10 * time.Second):
		t.Fatalf("the node kept running after %s", fault)
		return nil, ""
	}
}

type erroringNode struct {
	fakeNode
	errno syscall.Errno
}

func (n *erroringNode) InjectDiskError(e syscall.Errno) { n.errno = e }

// TestDiskErrorHookContract: the chaos harness's contract for POST /debug/fault/disk-error.
func TestDiskErrorHookContract(t *testing.T) {
	node := &erroringNode{}
	srv := httptest.NewServer((&adminServer{}).handler(node))
	defer srv.Close()
	post := func(query string) int {
		t.Helper()
		resp, err := http.Post(srv.URL+"/debug/fault/disk-error"+query, "text/plain", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for q, want := range map[string]syscall.Errno{"?errno=EIO": syscall.EIO, "?errno=ENOSPC": syscall.ENOSPC} {
		node.errno = 0
		if code := post(q); code != 200 || node.errno != want {
			t.Errorf("%s: %d, errno %v", q, code, node.errno)
		}
	}
	for _, q := range []string{"", "?errno=", "?errno=eio", "?errno=EPERM", "?errno=5"} {
		node.errno = 0
		if code := post(q); code != 400 || node.errno != 0 {
			t.Errorf("%q: %d, errno %v; want 400 and no error injected", q, code, node.errno)
		}
	}
}

// TestInjectedDiskErrorExitsOne: a one-node leased whose next raft log write fails with EIO or ENOSPC
// acknowledges nothing more and exits with status 1, its log naming the error and the WAL segment.
func TestInjectedDiskErrorExitsOne(t *testing.T) {
	skipShort(t)
	for name, errno := range map[string]syscall.Errno{"EIO": syscall.EIO, "ENOSPC": syscall.ENOSPC} {
		t.Run(name, func(t *testing.T) {
			err, log := faultedSolo(t, "disk-error?errno="+name)
			if !errors.Is(err, errno) || exitCode(err, io.Discard) != 1 {
				t.Fatalf("run returned %v (exit %d), want %v and exit 1", err, exitCode(err, io.Discard), errno)
			}
			if !strings.Contains(log, errno.Error()) || !strings.Contains(log, ".wal") {
				t.Errorf("the log does not name the error and the file:\n%s", log)
			}
		})
	}
}
