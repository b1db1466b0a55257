package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/leased/leased/server/servertest"
	"github.com/leased/leased/server/servertest/loopback"
)

// A refused endpoint is named, and the command does not wait out --timeout for it. Before: 5 s, then
// "cluster unavailable: context deadline exceeded".
func TestRefusedEndpointIsNamedAtOnce(t *testing.T) {
	addr := loopback.ReservePort(t).Addr // nothing listens there
	for _, args := range [][]string{
		{"acquire", "a", "--ttl", "10s"},
		{"get", "a"},
		{"release", "a", "--token", "1"},
	} {
		r := want(t, ctl(t, []string{addr}, args...), exitUnavailable)
		if !strings.Contains(r.stderr, addr+": connection refused") || strings.Contains(r.stderr, "deadline") {
			t.Errorf("%v: want the refusal named, got %v", args, r)
		}
		if r.elapsed > 4*time.Second { // --timeout is 5s; the refusal patience 1s
			t.Errorf("%v: took %v: it waited out --timeout", args, r.elapsed)
		}
	}
}

func TestErrorsNameTheCause(t *testing.T) {
	c := servertest.Start(t, 3, nil)
	eps := c.Endpoints()

	// The peer port: say so, and name the client port.
	peer := c.Node(0).PeerAddr()
	r := want(t, ctl(t, []string{peer}, "get", "x"), exitUnavailable)
	if !strings.Contains(r.stderr, peer+" is a leased peer port") || !strings.Contains(r.stderr, "client port") ||
		strings.Contains(r.stderr, "unknown service") {
		t.Fatalf("peer port: %v", r)
	}

	t.Logf("peer port: %s", r.stderr)
	// Limits in the flag's units with the cluster's bound (TestConfig's floor is 800ms).
	floor := c.Config(0).TTLFloor()
	r = want(t, ctl(t, eps, "acquire", "cause/ttl", "--ttl", "100ms"), exitUsage)
	if !strings.Contains(r.stderr, "--ttl 100ms is below the cluster's minimum "+floor.String()+" (") || strings.Contains(r.stderr, "ttl_ms") {
		t.Fatalf("--ttl below the minimum: %v", r)
	}
	t.Logf("ttl: %s", r.stderr)
	r = want(t, ctl(t, eps, "acquire", "cause/ttl", "--ttl", "2h"), exitUsage)
	if !strings.Contains(r.stderr, "--ttl 2h0m0s is above the cluster's maximum 1h0m0s") {
		t.Fatalf("--ttl above the maximum: %v", r)
	}
	r = want(t, ctl(t, eps, "acquire", "cause/ttl", "--ttl", "10s", "--lock-delay", "2m"), exitUsage)
	if !strings.Contains(r.stderr, "--lock-delay 2m0s is above the cluster's maximum 1m0s") {
		t.Fatalf("--lock-delay above the maximum: %v", r)
	}

	// http:// URLs are endpoints too.
	urls := make([]string, len(eps))
	for i, ep := range eps {
		urls[i] = "http://" + ep + "/"
	}
	want(t, ctl(t, urls, "acquire", "cause/http", "--ttl", "10s"), 0)
	want(t, ctl(t, urls, "get", "cause/http"), 0)

	// Two of three nodes down: each endpoint's failure is named once, and nothing is said twice.
	c.Stop(1)
	c.Stop(2)
	r = want(t, ctl(t, eps, "--timeout", "2s", "get", "cause/http"), exitUnavailable)
	msg := strings.TrimSpace(r.stderr)
	t.Logf("two nodes down: %s", msg)
	parts := strings.Split(msg, ": ")
	for i := 1; i < len(parts); i++ {
		if parts[i] == parts[i-1] {
			t.Errorf("%q says %q twice", msg, parts[i])
		}
	}
	if strings.Count(msg, "deadline exceeded") > 0 || !strings.Contains(msg, eps[1]+": connection refused") {
		t.Errorf("two nodes down: %v", r)
	}
}

// Two acquires from one host without --holder are two holders: the second is told which process holds
// the resource, with its token and the time left.
func testHeldNamesTheProcess(t *testing.T, eps []string) {
	first := mustJSON[leaseJSON](t, want(t, ctl(t, eps, "-o", "json", "acquire", "held/proc", "--ttl", "30s"), 0).stdout)
	if host, pid, ok := strings.Cut(first.Holder, ":"); !ok || host == "" || pid == "" {
		t.Fatalf("default holder %q, want host:pid", first.Holder)
	}
	r := want(t, ctl(t, eps, "acquire", "held/proc", "--ttl", "30s"), exitHeld)
	wantMsg := fmt.Sprintf(`"held/proc" is held by %s (token %d, `, first.Holder, first.Token)
	if !strings.Contains(r.stderr, wantMsg) || !strings.Contains(r.stderr, "s left)") {
		t.Fatalf("second acquire: want %q... left, got %v", wantMsg, r)
	}
}
