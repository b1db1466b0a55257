package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/client"
	"github.com/leased/leased/client/loadgen"
)

// dead is an endpoint that fails if dialled: a usage error must be reported before any dial, so these
// cases end at once with exit 2 rather than after --timeout with exit 5.
const dead = "127.0.0.1:1"

func TestUsageErrorsExitTwoBeforeNetwork(t *testing.T) {
	cases := [][]string{
		{},
		{"bogus"},
		{"acquire"},
		{"acquire", "x"},
		{"acquire", "x", "--ttl", "0s"},
		{"acquire", "x", "--ttl", "ten"},
		{"acquire", "x", "y", "--ttl", "1s"},
		{"acquire", "x", "--ttl", "1s", "--nope"},
		{"acquire", "x", "--ttl", "1s", "--wait-timeout", "1s"},
		{"acquire", "x", "--ttl", "1s", "--lock-delay", "-1s"},
		{"renew", "x"},
		{"renew", "x", "--token", "0"},
		{"renew", "x", "--token", "-3"},
		{"release", "x", "--token", "abc"},
		{"get"},
		{"get", ""},
		{"list", "extra"},
		{"list", "--limit", "-1"},
		{"watch", "a", "b"},
		{"watch", "a", "--prefix", "b"},
		{"watch", "--from-index", "x"},
		{"run", "x", "--ttl", "1s"},
		{"run", "x", "--ttl", "1s", "--"},
		{"run", "--ttl", "1s", "--", "true"},
		{"run", "x", "y", "--ttl", "1s", "--", "true"},
		{"run", "x", "--", "true"},
		{"run", "x", "--ttl", "1s", "--grace", "-1s", "--", "true"},
		{"elect", "x", "--", "true"},
		{"elect", "x", "--value", "v", "--ttl", "0s", "--", "true"},
		{"leader"},
		{"status", "extra"},
		{"member"},
		{"member", "frob"},
		{"member", "add", "n4"},
		{"member", "add", "n4", "--peer-addr", "nope"},
		{"member", "promote"}, // a NAME or an ID (names are looked up, so only the count is a usage error)
		{"member", "promote", "n4", "n5"},
		{"member", "remove", ""},
		{"member", "remove"},
		{"snapshot"},
		{"snapshot", "save"},
		{"snapshot", "status"},
		{"snapshot", "frob"},
		{"snapshot", "restore", "f", "--data-dir", "d", "--initial-cluster", "n1=h:1"},
		{"snapshot", "restore", "f", "--name", "n1", "--data-dir", "d", "--initial-cluster", "n1=nohostport"},
		{"snapshot", "restore", "f", "--name", "n9", "--data-dir", "d", "--initial-cluster", "n1=h:1"},
		{"snapshot", "restore", "f", "--name", "n1", "--data-dir", "d", "--initial-cluster", "n1=h:1,n1=h:2"},
		{"snapshot", "restore", "f", "--name", "n1", "--data-dir", "d", "--initial-cluster", "n1=h:1", "--token-floor", "0"},
		{"snapshot", "restore", "f", "--name", "n1", "--data-dir", "d", "--initial-cluster", "n1=h:1", "--token-floor", "-1"},
		{"-o", "yaml", "get", "x"},
		{"--timeout", "0s", "get", "x"},
		{"--timeout", "-1s", "status"},
		{"--endpoints", "nohostport", "get", "x"},
		{"--endpoints", ",", "get", "x"},
		{"--cacert", "/nonexistent/ca.pem", "get", "x"},
		{"--cert", "/nonexistent/c.pem", "get", "x"},
		{"--endpoints", "ftp://127.0.0.1:1", "get", "x"},
		{"--endpoints", "http://127.0.0.1:1,https://127.0.0.1:2", "get", "x"},
		{"completion", "tcsh"},
		{"completion"},
		{"help", "bogus"},
		{"acl", "frob"},
		{"snapshot", "frob"},
		{"bench", "keepalive", "--leases", "0"},
		{"bench", "keepalive", "--leases", "1000001"},
		{"bench", "keepalive", "--batch", "0"},
		{"bench", "keepalive", "--leases", "10", "--batch", "11"},
		{"bench", "keepalive", "--streams", "0"},
		{"bench", "keepalive", "--clients", "2"},
		{"bench", "keepalive", "--ttl", "-1s"},
		{"bench", "failover", "--clients", "2"},
		{"bench", "failover", "--gap", "-1s"},
		{"bench", "failover", "--duration", "0s"},
		{"bench", "acquire", "--gap", "1s"},
		{"bench", "renew", "--streams", "2"},
		{"bench", "acquire", "--ttl", "0s"},
	}
	for _, args := range cases {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			full := append([]string{"--endpoints", dead, "--timeout", "3s"}, args...)
			if len(args) > 0 && args[0] == "--endpoints" {
				full = append([]string{"--timeout", "3s"}, args...)
			}
			r := inProcess(full...)
			if len(args) == 0 {
				// No command prints the help, like --help.
				if r.code != 0 || !strings.Contains(r.stdout, "Usage:") {
					t.Fatalf("want help and exit 0, got %v", r)
				}
				return
			}
			if r.code != exitUsage {
				t.Fatalf("want exit 2, got %v", r)
			}
			if r.elapsed > time.Second {
				t.Errorf("took %v: the network was touched", r.elapsed)
			}
			if lines := strings.Count(strings.TrimSpace(r.stderr), "\n") + 1; lines != 1 || r.stdout != "" {
				t.Errorf("want one line on stderr and nothing on stdout, got %v", r)
			}
			if !strings.HasPrefix(r.stderr, "leasectl: ") || !strings.Contains(r.stderr, "--help") {
				t.Errorf("want 'leasectl: ... (see '... --help')', got %q", r.stderr)
			}
		})
	}
}

func TestUsageErrorJSON(t *testing.T) {
	r := inProcess("--endpoints", dead, "-o", "json", "acquire", "x", "--ttl", "bogus")
	if r.code != exitUsage {
		t.Fatalf("want exit 2, got %v", r)
	}
	var e struct {
		Error string `json:"error"`
		Code  int    `json:"code"`
	}
	if err := json.Unmarshal([]byte(r.stderr), &e); err != nil {
		t.Fatalf("stderr is not one JSON object: %v: %q", err, r.stderr)
	}
	if e.Code != 2 || !strings.Contains(e.Error, "ttl") {
		t.Fatalf("got %+v", e)
	}
}

func TestEndpointsFromEnvironment(t *testing.T) {
	t.Setenv(endpointsEnv, "not-an-endpoint")
	r := inProcess("get", "x")
	if r.code != exitUsage || !strings.Contains(r.stderr, "not-an-endpoint") {
		t.Fatalf("the environment was not used: %v", r)
	}
	// --endpoints wins over the environment: this one is valid, so the error is a connection one.
	r = inProcess("--endpoints", dead, "--timeout", "200ms", "get", "x")
	if r.code != exitUnavailable {
		t.Fatalf("--endpoints did not override the environment: %v", r)
	}
}

func TestHelpOfEveryCommandHasAnExample(t *testing.T) {
	a := &app{getenv: func(string) string { return "" }, signals: osSignals}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Hidden || strings.HasPrefix(c.Name(), "__") {
			return
		}
		if strings.TrimSpace(c.Example) == "" {
			t.Errorf("%q has no example", c.CommandPath())
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(a.rootCommand())

	for _, args := range [][]string{{"--help"}, {"acquire", "--help"}, {"run", "-h"}, {"member", "add", "--help"}, {"help", "watch"}} {
		r := inProcess(append([]string{"--endpoints", dead}, args...)...)
		if r.code != 0 || !strings.Contains(r.stdout, "Examples:") || r.stderr != "" {
			t.Errorf("%v: want help with examples on stdout and exit 0, got %v", args, r)
		}
	}
}

func TestCompletion(t *testing.T) {
	r := inProcess("completion", "bash")
	if r.code != 0 || !strings.Contains(r.stdout, "leasectl") {
		t.Fatalf("got %v", r)
	}
}

func TestExitCodeMapping(t *testing.T) {
	cases := []struct {
		err  error
		want int
	}{
		{nil, 0},
		{errors.New("boom"), 1},
		{&usageError{err: errors.New("bad flag")}, 2},
		{fmt.Errorf("acquire: %w", client.ErrInvalid), 2},
		{fmt.Errorf("acquire: %w", &client.HeldError{Resource: "r", Holder: "h", Token: 3}), 3},
		{fmt.Errorf("x: %w", client.ErrHeld), 3},
		{fmt.Errorf("member promote: %w", client.ErrPrecondition), 3},
		{fmt.Errorf("get: %w", client.ErrNotFound), 4},
		{fmt.Errorf("lease lost: %w", client.ErrExpired), 4},
		{fmt.Errorf("acquire: %w", &client.SupersededError{RequestID: "r1", GrantEnded: true}), 4},
		{fmt.Errorf("x: %w", client.ErrUnavailable), 5},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), 5},
		{fmt.Errorf("lease lost: %w", client.ErrLostContact), 5},
		{fmt.Errorf("x: %w", client.ErrLimit), 1},
		{fmt.Errorf("release: %w", client.ErrOutcomeUnknown), 7},
		{fmt.Errorf("release: %w", fmt.Errorf("%w: %w", client.ErrOutcomeUnknown, client.ErrUnavailable)), 7},
		{fmt.Errorf("x: %w", errInterrupted), 1},
		{&exitStatus{code: 7}, 7},
		{&exitStatus{code: 127, err: errors.New("start nope: not found")}, 127},
		{fmt.Errorf("member list: %w", client.ErrUnsupported), 1},
	}
	for _, c := range cases {
		if got := exitCode(c.err); got != c.want {
			t.Errorf("exitCode(%v) = %d, want %d", c.err, got, c.want)
		}
	}
	if !isQuiet(&exitStatus{code: 3}) || isQuiet(&exitStatus{code: 127, err: errors.New("x")}) || isQuiet(errors.New("x")) {
		t.Error("only a passed-through child status is quiet")
	}
}

func TestHeldErrorInPlainWordsAndJSON(t *testing.T) {
	err := fmt.Errorf("acquire %q: %w", "jobs/a", &client.HeldError{Resource: "jobs/a", Holder: "host-1", Token: 42, RemainingMs: 1500})
	if got, want := message(err), `"jobs/a" is held by host-1 (token 42, 1.5s left)`; got != want {
		t.Errorf("message = %q, want %q", got, want)
	}
	var buf strings.Builder
	a := &app{stderr: &buf}
	root := a.rootCommandForTest()
	a.output = "json"
	a.reportError(err, exitCode(err), root)
	var e map[string]any
	if err := json.Unmarshal([]byte(buf.String()), &e); err != nil {
		t.Fatalf("not JSON: %q", buf.String())
	}
	if e["code"] != float64(3) || e["holder"] != "host-1" || e["token"] != float64(42) {
		t.Fatalf("got %v", e)
	}
}

func (a *app) rootCommandForTest() *cobra.Command {
	a.getenv = func(string) string { return "" }
	a.signals = osSignals
	return a.rootCommand()
}

func TestJSONShapes(t *testing.T) {
	// The field names scripts rely on (docs/leasectl.md).
	cases := []struct {
		v    any
		keys []string
	}{
		{leaseJSON{}, []string{"resource", "holder", "token", "ttl_ms", "value"}},
		{infoJSON{}, []string{"resource", "holder", "token", "remaining_ms", "value"}},
		{eventJSON{}, []string{"type", "resource", "holder", "token", "index"}},
		{nodeJSON{}, []string{"name", "id", "client_addr", "role", "term", "leader", "leader_id", "commit_index", "applied_index", "db_size_bytes", "live_leases", "version", "loop_stalled_ms", "healthy"}},
		{memberJSON{}, []string{"id", "name", "peer_addr", "client_addr", "is_learner"}},
		{leaderJSON{}, []string{"resource", "holder", "token", "value"}},
		{benchJSON{}, []string{"workload", "clients", "duration_ms", "ops", "errors", "rate", "p50_ms", "p90_ms", "p99_ms", "max_ms"}},
		{keepAliveJSON{}, []string{"workload", "streams", "leases", "batch", "duration_ms", "ops", "errors", "renewals", "rate",
			"batches_per_s", "p50_ms", "p90_ms", "p99_ms", "max_ms", "released"}},
		{failoverJSON{}, []string{"workload", "gap_ms", "duration_ms", "ops", "errors", "release_errors", "outages",
			"outage_median_ms", "outage_max_ms"}},
		{outageJSON{}, []string{"start_ms", "started_at", "length_ms", "ended", "errors"}},
	}
	for _, c := range cases {
		b, err := json.Marshal(c.v)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		for _, k := range c.keys {
			if _, ok := m[k]; !ok {
				t.Errorf("%T: no %q in %s", c.v, k, b)
			}
		}
	}
}

// Member ids are printed as FormatID spells them, in JSON as strings (jq rounds numbers above 2^53).
func TestMembersPrintHexIDs(t *testing.T) {
	ms := []client.Member{{ID: 1<<63 | 0xa3, Name: "n1", PeerAddr: "10.0.0.1:7201"}, {ID: 4, Name: "n4", PeerAddr: "10.0.0.4:7201", IsLearner: true}}
	var out strings.Builder
	a := &app{stdout: &out, output: "json"}
	if err := a.printMembers(ms); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want one line per member, got %q", out.String())
	}
	for i, want := range []string{"80000000000000a3", "0000000000000004"} {
		var m map[string]any
		if err := json.Unmarshal([]byte(lines[i]), &m); err != nil {
			t.Fatal(err)
		}
		if m["id"] != want {
			t.Errorf("member %d: id %#v, want %q", i, m["id"], want)
		}
	}
	out.Reset()
	a.output = "table"
	if err := a.printMembers(ms); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "80000000000000a3") || !strings.Contains(out.String(), "0000000000000004") {
		t.Errorf("member table: %q", out.String())
	}
}

func TestChildStatus(t *testing.T) {
	if got := childStatus(nil, nil); got != 0 {
		t.Errorf("got %d", got)
	}
	if got := childStatus(nil, errors.New("x")); got != 1 {
		t.Errorf("got %d", got)
	}
}

// bench failover fails only when nothing was granted, when interrupted, or when the run ended in an
// outage; the failed acquires of the outages it saw end are its measurement.
func TestFailoverOutcome(t *testing.T) {
	down := errors.New("down")
	ended := loadgen.Outage{Length: time.Second, Ended: true, Errors: 3}
	for _, c := range []struct {
		r           loadgen.FailoverResult
		interrupted bool
		want        int
	}{
		{loadgen.FailoverResult{Result: loadgen.Result{Ops: 10}}, false, 0},
		{loadgen.FailoverResult{Result: loadgen.Result{Ops: 10, Errors: 3, FirstErr: down}, Outages: []loadgen.Outage{ended}}, false, 0},
		{loadgen.FailoverResult{Result: loadgen.Result{Ops: 10}, Outages: []loadgen.Outage{ended, {Length: time.Second}}}, false, 1},
		{loadgen.FailoverResult{Result: loadgen.Result{Ops: 10}}, true, 1},
		{loadgen.FailoverResult{Result: loadgen.Result{Ops: 4, Errors: 4, FirstErr: fmt.Errorf("x: %w", client.ErrUnavailable)}}, false, 5},
	} {
		if got := exitCode(failoverOutcome(c.r, c.interrupted)); got != c.want {
			t.Errorf("failoverOutcome(%+v, %v) exits %d, want %d", c.r, c.interrupted, got, c.want)
		}
	}
}

// A leader whose raft loop stalled answers with its role but no leader and the stall: its row says so,
// in JSON and in the table, and counts as unhealthy.
func TestStatusShowsAStalledLoop(t *testing.T) {
	st := &client.NodeStatus{Id: 0xa3, Name: "n1", Role: leasepb.Role_ROLE_LEADER, Term: 4, LoopStalledMs: 2140}
	row := statusRow(st, map[uint64]string{0xa3: "n1"}, "127.0.0.1:7101")
	if row.Healthy || row.Leader != "" || row.LoopStalledMS != 2140 || row.Role != "leader" || row.ClientAddr != "127.0.0.1:7101" {
		t.Fatalf("stalled leader's row: %+v", row)
	}
	var out strings.Builder
	a := &app{stdout: &out, output: "json"}
	if err := a.printStatus([]nodeJSON{row}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `"loop_stalled_ms":2140`) || !strings.Contains(out.String(), `"healthy":false`) {
		t.Errorf("JSON: %s", out.String())
	}
	out.Reset()
	a.output = "table"
	if err := a.printStatus([]nodeJSON{row}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "unhealthy: loop stalled 2.1s") {
		t.Errorf("table: %s", out.String())
	}
}

// An unreachable endpoint's row carries its whole cause, however long: the hint is at its end.
func TestStatusKeepsTheWholeCause(t *testing.T) {
	cause := "127.0.0.1:7501: answers HTTP/1.1, not gRPC: it is a leased HTTP/JSON API or admin port (--http-addr, --admin-addr); use the node's client port (--client-addr, 7101 by default)"
	var out strings.Builder
	a := &app{stdout: &out, output: "table"}
	if err := a.printStatus([]nodeJSON{{ClientAddr: "127.0.0.1:7501", Role: "unreachable", Error: cause}}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), cause) || strings.Contains(out.String(), "…") {
		t.Errorf("table cuts the cause:\n%s", out.String())
	}
}
