//go:build linux

package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/leased/leased/api/leasepb"
)

// TestDescriptorLimitLeavesRoomForHealth runs the real binary under a descriptor limit of 512 (ulimit -n,
// soft and hard, so Go cannot raise it) and opens more idle connections to its client port than it has
// descriptors. With the default --max-connections (sized to the limit) the node refuses the excess instead
// of running out: the admin port's /healthz and /readyz answer, and a client connected before the flood
// still acquires.
func TestDescriptorLimitLeavesRoomForHealth(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	const nofile, flood = 512, 700
	dir := t.TempDir()
	bin := filepath.Join(dir, "leased")
	gocmd := filepath.Join(runtime.GOROOT(), "bin", "go")
	if out, err := exec.Command(gocmd, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build leased: %v\n%s", err, out)
	}
	var own syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &own); err != nil || own.Cur < 4*flood {
		t.Skipf("this process may open %d descriptors (%v); the test needs %d", own.Cur, err, 4*flood)
	}
	addrs := freeAddrs(t, 3)
	client, peer, admin := addrs[0], addrs[1], addrs[2]
	stderr := &syncBuffer{}
	cmd := exec.Command("/bin/sh", "-c", `ulimit -n "$0" && exec "$@"`, "512", bin,
		"--name=solo", "--data-dir="+filepath.Join(dir, "solo"), "--client-addr="+client, "--peer-addr="+peer,
		"--admin-addr="+admin, "--initial-cluster=solo="+peer, "--election-timeout=100ms")
	cmd.Stderr = stderr
	cmd.Env = os.Environ()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Error("leased did not exit on SIGTERM")
		}
	}()

	conn, err := grpc.NewClient(client, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	leases := leasepb.NewLeasesClient(conn)
	acquire := func(resource string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := leases.Acquire(ctx, &leasepb.AcquireRequest{Resource: resource, Holder: "h", TtlMs: 60_000})
		return err
	}
	for deadline := time.Now().Add(20 * time.Second); acquire("fd/0") != nil; {
		if time.Now().After(deadline) {
			t.Fatalf("no leader after 20 s:\n%s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}

	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range flood {
		c, err := net.DialTimeout("tcp", client, 5*time.Second)
		if errors.Is(err, syscall.ECONNRESET) {
			continue // closed on accept
		}
		if err != nil {
			t.Fatalf("dial %d: %v", len(conns)+1, err)
		}
		conns = append(conns, c)
	}
	hc := &http.Client{Timeout: 5 * time.Second}
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := hc.Get("http://" + admin + path)
		if err != nil {
			t.Fatalf("admin %s with %d connections open under a limit of %d descriptors: %v\n%s", path, flood, nofile, err, tail(stderr.String()))
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("admin %s: %s", path, resp.Status)
		}
	}
	if err := acquire("fd/1"); err != nil {
		t.Fatalf("the client connected before the flood: %v", err)
	}
}

// tail is the last lines of a log, for a failure message.
func tail(log string) string {
	lines := strings.Split(log, "\n")
	return strings.Join(lines[max(0, len(lines)-20):], "\n")
}
