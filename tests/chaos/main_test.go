// Package chaos is leased's fault-injection and linearizability harness. It runs a real
// 3-node cluster of leased processes on 127.0.0.1 whose peer links all pass through a fault proxy
// (proxy_test.go), drives a workload of SDK clients that acquire / hold / write through a fence /
// release / get on hot and cold resources (workload_test.go), injects faults from a seeded schedule
// (run_test.go: SIGKILL, SIGSTOP, partitions, one-way cuts, delays, paused holders, client clock skew),
// and checks invariants I1–I6 of docs/guarantees.md (checkers_test.go, model_test.go). With
// LEASED_CHAOS_GRAY=1 it adds the gray failures (gray_test.go: a frozen leader, clients'
// links to it black-holed through the client-side fault layer of clientnet_test.go, a stalled disk),
// and it always checks L1 (l1check_test.go) and every answer against the applied log (logcheck_test.go).
//
// The default test run includes a short, bounded run (about a minute). A soak:
//
//	make chaos SEED=42 DURATION=30m
//
// which sets LEASED_CHAOS_SEED and LEASED_CHAOS_DURATION. The seed fixes the schedule of faults and every
// workload choice (math/rand/v2 PCG streams); it cannot fix the interleaving of real processes. -short
// skips the cluster runs (the checker unit tests still run).
package chaos

import (
	"flag"
	"fmt"
	"os"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/leased/leased/tests/internal/proc"
)

var buildDir string

func TestMain(m *testing.M) {
	flag.Parse()
	dir, err := os.MkdirTemp("", "leased-chaos-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	buildDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

var (
	buildMu sync.Mutex
	built   = map[string]string{}
)

// leasedBinary builds cmd/leased with the given build tags (comma-separated; once per tag set) and returns
// its path. The chaos runs use "faultinject" (the disk-stall hook on the admin address); LEASED_CHAOS_BINARY
// replaces that build.
func leasedBinary(t testing.TB, tags string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := built[tags]; ok {
		return p
	}
	if env := os.Getenv("LEASED_CHAOS_BINARY"); env != "" && tags == "faultinject" {
		built[tags] = env
		return env
	}
	p, err := proc.Build(buildDir, tags)
	if err != nil {
		t.Fatal(err)
	}
	built[tags] = p
	return p
}
