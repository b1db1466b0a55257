package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server/servertest"
)

// limitScript is the command the --limit test runs: it marks itself inside (a file named by its token in
// the directory $0), waits (bounded) until a second copy is inside too, logs how many copies it sees
// inside before and after a short stay, and leaves. With at most 2 slots a third copy never appears.
const limitScript = `dir=$0; log=$1
touch "$dir/$LEASE_TOKEN"
i=0
while [ "$(ls "$dir" | wc -l)" -lt 2 ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done
echo "$(ls "$dir" | wc -l) $LEASE_TOKEN $LEASE_LIMIT" >> "$log"
sleep 0.2
echo "$(ls "$dir" | wc -l) $LEASE_TOKEN $LEASE_LIMIT" >> "$log"
rm "$dir/$LEASE_TOKEN"`

// TestRunLimitRunsAtMostNCopies: five `leasectl run --limit 2 --wait` started together run their command
// at most two at a time (and two do run together), each with its own token; a run without --wait while
// both slots are held exits 3, and one that asks another limit exits 2.
func TestRunLimitRunsAtMostNCopies(t *testing.T) {
	c := servertest.Start(t, 3, nil)
	eps := c.Endpoints()
	dir, log := t.TempDir(), filepath.Join(t.TempDir(), "log")
	var wg sync.WaitGroup
	results := make([]result, 5)
	for i := range results {
		wg.Go(func() {
			results[i] = ctl(t, eps, "run", "pool/copies", "--ttl", "10s", "--limit", "2", "--wait", "--",
				"sh", "-c", limitScript, dir, log)
		})
	}
	wg.Wait()
	for _, r := range results {
		want(t, r, 0)
	}
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	most, tokens := 0, map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		n, err := strconv.Atoi(f[0])
		if err != nil || len(f) != 3 || f[2] != "2" {
			t.Fatalf("log line %q", line)
		}
		most = max(most, n)
		tokens[f[1]] = true
	}
	if most != 2 {
		t.Fatalf("at most %d copies ran at once, want exactly 2:\n%s", most, b)
	}
	if len(tokens) != 5 {
		t.Fatalf("%d distinct tokens for 5 runs:\n%s", len(tokens), b)
	}

	// Both slots held: a run without --wait does not start its command and exits 3.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 2 {
		if _, err := c.Leases(c.WaitLeader()).Acquire(ctx, &leasepb.AcquireRequest{Resource: "pool/full", Holder: "other", TtlMs: 30_000, Limit: 2}); err != nil {
			t.Fatal(err)
		}
	}
	marker := filepath.Join(t.TempDir(), "ran")
	r := want(t, ctl(t, eps, "run", "pool/full", "--ttl", "10s", "--limit", "2", "--", "touch", marker), 3)
	if _, err := os.Stat(marker); err == nil {
		t.Fatalf("the command ran although every slot was held: %v", r)
	}
	r = want(t, ctl(t, eps, "run", "pool/full", "--ttl", "10s", "--limit", "3", "--", "touch", marker), 2)
	if !strings.Contains(r.stderr, "semaphore of 2 slots") {
		t.Fatalf("limit mismatch not explained: %v", r)
	}
	want(t, ctl(t, eps, "run", "pool/full", "--ttl", "10s", "--limit", "-1", "--", "true"), 2)
}
