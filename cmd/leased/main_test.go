package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/leased/leased/cmd/internal/buildinfo"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestVersion(t *testing.T) {
	want := "leased " + buildinfo.Read().String() + "\n"
	for _, getenv := range []func(string) string{env(), env("LEASED_VERSION", "v1.2.3"), env("LEASED_VERSION", "false")} {
		var stdout bytes.Buffer
		if err := run(context.Background(), []string{"--version"}, getenv, &stdout, &bytes.Buffer{}); err != nil {
			t.Fatal(err)
		}
		if got := stdout.String(); got != want {
			t.Errorf("--version printed %q, want %q", got, want)
		}
	}
}

// LEASED_VERSION names the version a deployment runs; it neither sets --version nor is a bad value.
func TestVersionIsNotReadFromTheEnvironment(t *testing.T) {
	o, err := parseFlags(nil, env("LEASED_VERSION", "v1.2.3", "LEASED_NAME", "n1"), &bytes.Buffer{})
	if err != nil || o.showVersion || o.cfg.Name != "n1" {
		t.Fatalf("with LEASED_VERSION=v1.2.3: showVersion %v, name %q, err %v", o.showVersion, o.cfg.Name, err)
	}
}

func TestConfigErrorsExitOne(t *testing.T) {
	err := run(context.Background(), []string{"--admin-addr="}, env(), &bytes.Buffer{}, &bytes.Buffer{})
	var stderr bytes.Buffer
	if code := exitCode(err, &stderr); code != 1 {
		t.Fatalf("exit code %d for a config without name, want 1 (err %v)", code, err)
	}
	if msg := stderr.String(); !strings.Contains(msg, "name is required") || strings.Count(msg, "\n") != 1 {
		t.Errorf("message %q", msg)
	}
}

// TestBadSettingsExitOne: a setting the node cannot run with is a configuration error (exit 1) whose
// message says why. With the default 1 s election timeout the TTL floor is 8 s, so --min-ttl=3s names the
// floor (before it existed, 3 s was accepted and such a lease was lost on a leader SIGKILL); --expiry-rate=0
// would never expire a lease.
func TestBadSettingsExitOne(t *testing.T) {
	for flag, want := range map[string]string{
		"--min-ttl=3s":    "min TTL 3s is below the TTL floor 8s",
		"--expiry-rate=0": "expiry rate must be positive",
	} {
		args := []string{"--name=n1", "--data-dir=" + t.TempDir(), "--admin-addr=", "--initial-cluster=n1=127.0.0.1:7201", flag}
		err := run(context.Background(), args, env(), &bytes.Buffer{}, &bytes.Buffer{})
		var stderr bytes.Buffer
		if code := exitCode(err, &stderr); code != 1 || !strings.Contains(stderr.String(), want) {
			t.Errorf("%s: exit %d, %q; want 1 and %q", flag, code, stderr.String(), want)
		}
	}
}

// TestRunServesUntilCancelled runs a one-node cluster in process, reads its metrics, and stops it as a
// signal would.
func TestRunServesUntilCancelled(t *testing.T) {
	skipShort(t)
	// Neither a container's memory limit nor the environment's: leased leaves GOGC as the runtime has it.
	t.Setenv("AUTOMEMLIMIT", "off")
	prevLimit := debug.SetMemoryLimit(math.MaxInt64)
	t.Cleanup(func() { debug.SetMemoryLimit(prevLimit) })
	addrs := freeAddrs(t, 2)
	peer, admin := addrs[0], addrs[1]
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	stderr := &syncBuffer{}
	args := []string{
		"--name=solo", "--data-dir=" + filepath.Join(t.TempDir(), "solo"), "--client-addr=127.0.0.1:0",
		"--peer-addr=" + peer, "--admin-addr=" + admin, "--initial-cluster=solo=" + peer,
		"--election-timeout=50ms", "--log-level=debug",
	}
	gogc := gcPercent() // the runtime's, before leased starts
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, env(), &bytes.Buffer{}, stderr) }()
	// A one-node cluster elects itself; wait for it to say so.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(stderr.String(), `msg="became leader"`) {
		select {
		case err := <-done:
			t.Fatalf("run returned early: %v\n%s", err, stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no leader after 10s:\n%s", stderr.String())
		}
	}
	// leased sets no GOGC of its own: the runtime's is what runs, and the start-up line says which.
	if log := stderr.String(); !strings.Contains(log, fmt.Sprintf("gogc=%d memory_limit=none", gogc)) {
		t.Errorf("the start-up line does not name GOGC %d and the memory limit:\n%s", gogc, log)
	}
	metrics := fetch(t, "http://"+admin+"/metrics")
	if m := regexp.MustCompile(`\ngo_gc_gogc_percent (\d+)\n`).FindStringSubmatch(metrics); m == nil || m[1] != fmt.Sprint(uint64(gogc)) {
		t.Errorf("go_gc_gogc_percent %v, want the runtime's %d: leased sets no GOGC", m, gogc)
	}
	for _, want := range []string{"leased_is_leader 1", "leased_live_leases 0", "leased_disk_fsync_duration_seconds_count", "leased_build_info{", "go_goroutines"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	cancel(errors.New("test stop"))
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("clean shutdown returned %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("run did not return after cancel")
	}
}

func TestAdminEndpoints(t *testing.T) {
	a := &adminServer{}
	node := &fakeNode{}
	srv := httptest.NewServer(a.handler(node))
	defer srv.Close()
	var body string
	get := func(path string) int {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		body = string(b)
		return resp.StatusCode
	}
	if c := get("/healthz"); c != 200 {
		t.Errorf("/healthz %d", c)
	}
	if c := get("/readyz"); c != 503 {
		t.Errorf("/readyz without a leader %d, want 503", c)
	}
	node.leader.Store(0xa3)
	if c := get("/readyz"); c != 200 {
		t.Errorf("/readyz with a leader %d, want 200", c)
	}
	// The one spelling of ids: 16 lower-case hex digits.
	if body != "ok: leader 00000000000000a3\n" {
		t.Errorf("/readyz with a leader says %q", body)
	}
	node.leader.Store(1<<63 + 0xbeef)
	if get("/readyz"); body != "ok: leader 800000000000beef\n" {
		t.Errorf("/readyz with a large leader id says %q", body)
	}
	a.setStopping()
	if c := get("/readyz"); c != 503 {
		t.Errorf("/readyz while stopping %d, want 503", c)
	}
	if c := get("/nope"); c != 404 {
		t.Errorf("/nope %d", c)
	}
}

type fakeNode struct{ leader atomic.Uint64 }

func (f *fakeNode) Leader() uint64 { return f.leader.Load() }

// syncBuffer is a bytes.Buffer safe for the logger and the test to share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

var (
	_ leaderKnower = (*server.Server)(nil)
	_ readier      = (*server.Server)(nil)
)

// freeAddrs returns n distinct loopback addresses for a leased binary to listen on
// (servertest.FreeAddrs: drawn below the ephemeral range, where an outgoing connection of another test
// could take a port from :0 before the binary binds it).
func freeAddrs(t *testing.T, n int) []string { return servertest.FreeAddrs(t, n) }

func fetch(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return string(body)
}
