package main

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leased/leased/server/servertest"
)

// testBench runs each workload of `leasectl bench` for a second against the cluster and checks that the
// numbers are those of real work: operations succeeded, latencies are ordered, and the leases the acquire
// and read workloads report exist in the cluster under the names they document.
func testBench(t *testing.T, eps []string) {
	for _, tc := range []struct {
		workload, prefix string
		args             []string
	}{{"acquire", "acquire", []string{"--clients", "4"}}, {"contended", "contended", []string{"--clients", "3"}},
		{"renew", "renew", []string{"--clients", "2"}}, {"read", "read", []string{"--clients", "2"}},
		{"read", "read-s", []string{"--serializable"}}} {
		args := append([]string{"-o", "json", "bench", tc.workload, "--duration", "1s", "--resources", "bench-e2e/" + tc.prefix}, tc.args...)
		r := want(t, ctl(t, eps, args...), 0)
		got := mustJSON[benchJSON](t, r.stdout)
		if got.Workload != tc.workload || got.Serializable != slices.Contains(tc.args, "--serializable") ||
			got.Clients == 0 || got.Ops == 0 || got.Errors != 0 || got.Rate <= 0 ||
			got.P50Ms <= 0 || got.P50Ms > got.P90Ms || got.P90Ms > got.P99Ms || got.P99Ms > got.MaxMs ||
			got.DurationMs < 1000 {
			t.Fatalf("bench %s: %+v\n%v", tc.workload, got, r)
		}
		t.Logf("bench %s %v: %d ops, %.0f/s, p50 %.2f ms, p99 %.2f ms", tc.workload, tc.args, got.Ops, got.Rate, got.P50Ms, got.P99Ms)
	}
	// read holds the lease it reads, under its own name.
	for _, res := range []string{"bench-e2e/read/read", "bench-e2e/read-s/read"} {
		if info := mustJSON[infoJSON](t, want(t, ctl(t, eps, "-o", "json", "get", res), 0).stdout); info.Holder != res {
			t.Fatalf("get %s: %+v", res, info)
		}
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
		{"bench", "acquire", "--duration", "0s"}, {"bench", "acquire", "--resources", ""},
		{"bench", "keepalive", "--batch", "10001"}, {"bench", "keepalive", "--clients", "4"}, {"bench", "failover", "--gap", "0s"},
		{"bench", "acquire", "--serializable"}} {
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

// testBenchKeepAlive: bench keepalive renews every batch it sends in full, counts the renewals, and
// releases the leases it took at the end.
func testBenchKeepAlive(t *testing.T, eps []string) {
	r := want(t, ctl(t, eps, "-o", "json", "bench", "keepalive", "--leases", "2000", "--batch", "100", "--streams", "2",
		"--duration", "1s", "--resources", "bench-e2e/ka"), 0)
	got := mustJSON[keepAliveJSON](t, r.stdout)
	if got.Workload != "keepalive" || got.Streams != 2 || got.Leases != 2000 || got.Batch != 100 || got.Ops == 0 ||
		got.Errors != 0 || got.Renewals != int64(got.Ops)*100 || got.Rate <= got.BatchesPerS || got.BatchesPerS <= 0 ||
		got.P50Ms <= 0 || got.P50Ms > got.P90Ms || got.P90Ms > got.P99Ms || got.P99Ms > got.MaxMs || got.DurationMs < 1000 ||
		got.Released != 2000 {
		t.Fatalf("bench keepalive: %+v\n%v", got, r)
	}
	if !strings.Contains(r.stderr, "took 2000 leases") || !strings.Contains(r.stderr, "released 2000 leases") {
		t.Fatalf("bench keepalive stderr: %q", r.stderr)
	}
	t.Logf("bench keepalive: %d batches, %.0f renewals/s, p50 %.2f ms, p99 %.2f ms", got.Ops, got.Rate, got.P50Ms, got.P99Ms)
	// Nothing is left held; the leases were named PREFIX/keepalive/N.
	want(t, ctl(t, eps, "get", "bench-e2e/ka/keepalive/0"), 4)
	if left := want(t, ctl(t, eps, "-o", "json", "list", "--prefix", "bench-e2e/ka/"), 0).stdout; strings.TrimSpace(left) != "" {
		t.Fatalf("leases left after bench keepalive: %s", left)
	}
	// The table: a header and one row, BATCHES bounded by --max-ops.
	table := want(t, ctl(t, eps, "bench", "keepalive", "--leases", "100", "--batch", "10", "--duration", "10s", "--max-ops", "5",
		"--resources", "bench-e2e/ka-max"), 0)
	rows := strings.Split(strings.TrimSpace(table.stdout), "\n")
	if len(rows) != 2 || strings.Join(strings.Fields(rows[0])[:6], " ") != "WORKLOAD STREAMS LEASES BATCH DURATION BATCHES" ||
		!strings.HasPrefix(rows[1], "keepalive") || strings.Fields(rows[1])[5] != "5" {
		t.Fatalf("table:\n%s", table.stdout)
	}
}

// testBenchFailoverQuiet: without a fault, bench failover acquires, finds no outage (with a gap no
// stall reaches), exits 0 and leaves nothing held.
func testBenchFailoverQuiet(t *testing.T, eps []string) {
	r := want(t, ctl(t, eps, "-o", "json", "bench", "failover", "--duration", "1s", "--gap", "10s", "--resources", "bench-e2e/fo"), 0)
	got := mustJSON[failoverJSON](t, r.stdout)
	if got.Workload != "failover" || got.GapMs != 10000 || got.Ops == 0 || got.Errors != 0 || got.ReleaseErrors != 0 ||
		got.Outages == nil || len(got.Outages) != 0 || got.OutageMaxMs != 0 || got.DurationMs < 1000 ||
		!strings.Contains(r.stdout, `"outages":[]`) {
		t.Fatalf("bench failover: %+v\n%v", got, r)
	}
	if !strings.Contains(r.stderr, "stop, kill or partition the leader now") {
		t.Fatalf("bench failover stderr: %q", r.stderr)
	}
	if left := want(t, ctl(t, eps, "-o", "json", "list", "--prefix", "bench-e2e/fo/"), 0).stdout; strings.TrimSpace(left) != "" {
		t.Fatalf("leases left after bench failover: %s", left)
	}
	table := want(t, ctl(t, eps, "bench", "failover", "--duration", "10s", "--max-ops", "5", "--gap", "10s", "--resources", "bench-e2e/fo-max"), 0)
	rows := strings.Split(strings.TrimSpace(table.stdout), "\n")
	if len(rows) != 2 || strings.Join(strings.Fields(rows[0])[:4], " ") != "WORKLOAD DURATION GAP OPS" ||
		!strings.HasPrefix(rows[1], "failover") || strings.Fields(rows[1])[3] != "5" {
		t.Fatalf("table:\n%s", table.stdout)
	}
}

// outageOver matches failover's line for an outage's end.
var outageOver = regexp.MustCompile(`outage over: (\S+) without an acquire since (\S+) `)

// outageHold is how long TestBenchFailoverReportsAnOutage keeps the cluster without a quorum: the
// fault's length, many gaps long.
const outageHold = time.Second

// TestBenchFailoverReportsAnOutage stops the leader of a three-node cluster (a follower stopped first, so
// no quorum is left) during bench failover, brings the follower back, and checks that the outage is told
// as it ends and reported, spanning the restart.
func TestBenchFailoverReportsAnOutage(t *testing.T) {
	c := servertest.Start(t, 3, nil)
	cmd := exec.Command(bin, "--endpoints", strings.Join(c.Endpoints(), ","), "--timeout", "1s", "-o", "json",
		"bench", "failover", "--duration", "10m", "--gap", "100ms", "--resources", "bench-outage")
	var stdout strings.Builder
	cmd.Stdout = &stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := lineReader(stderr)
	var seen []string
	next := func() string {
		l := nextLine(t, lines, time.Minute)
		seen = append(seen, l)
		return l
	}
	defer func() {
		if t.Failed() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Logf("stderr so far:\n%s", strings.Join(seen, "\n"))
		}
		for range lines { // the reader ends with the process
		}
	}()
	for !strings.Contains(next(), "stop, kill or partition the leader now") {
	}

	follower := c.Follower()
	c.Stop(follower)
	c.Stop(c.WaitLeader()) // one node of three is left: nothing can be granted
	// The fault lasts outageHold; this is its length, not a wait for a condition.
	<-time.After(outageHold)
	restarted := time.Now()
	c.Restart(follower)

	// The first acquire after the restart ends the outage, and bench says so.
	for {
		m := outageOver.FindStringSubmatch(next())
		if m == nil {
			continue
		}
		length, err1 := time.ParseDuration(m[1])
		start, err2 := time.Parse(timestampLayout, m[2])
		if err1 != nil || err2 != nil {
			t.Fatalf("outage line %q: %v %v", m[0], err1, err2)
		}
		if !start.Add(length + 5*time.Millisecond).Before(restarted) { // an earlier, spurious stall ended before it
			break
		}
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, cmd, 30*time.Second); code != 1 {
		t.Fatalf("bench failover exited %d after SIGINT, want 1", code)
	}
	got := mustJSON[failoverJSON](t, stdout.String())
	var spanning *outageJSON
	for i, o := range got.Outages {
		start, err := time.Parse(timestampLayout, o.StartedAt)
		if err != nil {
			t.Fatalf("outage %d started_at %q: %v", i, o.StartedAt, err)
		}
		end := start.Add(time.Duration(o.LengthMs*float64(time.Millisecond)) + 5*time.Millisecond)
		if o.Ended && start.Before(restarted) && !end.Before(restarted) {
			spanning = &got.Outages[i]
		}
	}
	if spanning == nil || spanning.LengthMs < float64(outageHold.Milliseconds())/2 || got.OutageMaxMs < spanning.LengthMs ||
		got.OutageMedianMs <= 0 || got.Ops <= got.Errors {
		t.Fatalf("no outage across the restart at %s: %+v", restarted.Format(timestampLayout), got)
	}
	t.Logf("outage of %.0f ms (%d acquires failed in it); %d outages in all, %d of %d acquires failed",
		spanning.LengthMs, spanning.Errors, len(got.Outages), got.Errors, got.Ops)
}
