package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// testBench runs each workload of `leasectl bench` for a second against the cluster and checks that the
// numbers are those of real work: operations succeeded, latencies are ordered, and the leases the acquire
// workload reports exist in the cluster under the names it documents.
func testBench(t *testing.T, eps []string) {
	for _, tc := range []struct {
		workload string
		clients  string
	}{{"acquire", "4"}, {"contended", "3"}, {"renew", "2"}} {
		r := want(t, ctl(t, eps, "-o", "json", "bench", tc.workload, "--clients", tc.clients, "--duration", "1s",
			"--resources", "bench-e2e/"+tc.workload), 0)
		got := mustJSON[benchJSON](t, r.stdout)
		if got.Workload != tc.workload || got.Clients == 0 || got.Ops == 0 || got.Errors != 0 || got.Rate <= 0 ||
			got.P50Ms <= 0 || got.P50Ms > got.P90Ms || got.P90Ms > got.P99Ms || got.P99Ms > got.MaxMs ||
			got.DurationMs < 1000 {
			t.Fatalf("bench %s: %+v\n%v", tc.workload, got, r)
		}
		t.Logf("bench %s: %d ops, %.0f/s, p50 %.2f ms, p99 %.2f ms", tc.workload, got.Ops, got.Rate, got.P50Ms, got.P99Ms)
	}
	// acquire's first lease of worker 0 is held under the documented name.
	info := mustJSON[infoJSON](t, want(t, ctl(t, eps, "-o", "json", "get", "bench-e2e/acquire/0/0"), 0).stdout)
	if info.Token == 0 || !strings.HasPrefix(info.Holder, "bench-e2e/acquire-0-") {
		t.Fatalf("get bench-e2e/acquire/0/0: %+v", info)
	}
	// The table has a header and one row; --max-ops bounds the run.
	table := want(t, ctl(t, eps, "bench", "acquire", "--duration", "10s", "--max-ops", "5", "--resources", "bench-e2e/max"), 0)
	rows := strings.Split(strings.TrimSpace(table.stdout), "\n")
	if len(rows) != 2 || !strings.HasPrefix(rows[0], "WORKLOAD") || !strings.HasPrefix(rows[1], "acquire") ||
		strings.Fields(rows[1])[3] != "5" {
		t.Fatalf("table:\n%s", table.stdout)
	}
	// Bad input is a usage error and runs nothing.
	for _, args := range [][]string{{"bench"}, {"bench", "lock"}, {"bench", "acquire", "--clients", "0"}, {"bench", "acquire", "--clients", "10001"},
		{"bench", "acquire", "--duration", "0s"}, {"bench", "acquire", "--resources", ""}} {
		r := want(t, ctl(t, eps, args...), 2)
		if r.stdout != "" {
			t.Fatalf("%v printed %q", args, r.stdout)
		}
	}
}

// testBenchInterrupt: SIGINT ends a long bench early; it still prints what it measured, and exits 1.
func testBenchInterrupt(t *testing.T, eps []string) {
	cmd := exec.Command(bin, "--endpoints", strings.Join(eps, ","), "-o", "json", "bench", "acquire",
		"--clients", "2", "--duration", "10m", "--resources", "bench-int")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pollHolder(t, eps, "bench-int/0/0", "bench-int-0-0") // the run is under way
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, cmd, 20*time.Second); code != 1 {
		t.Fatalf("bench exited %d after SIGINT: %s", code, stderr.String())
	}
	got := mustJSON[benchJSON](t, stdout.String())
	if got.Ops == 0 || got.DurationMs >= (10*time.Minute).Milliseconds() || !strings.Contains(stderr.String(), "interrupted") {
		t.Fatalf("after SIGINT: %+v, stderr %q", got, stderr.String())
	}
}
