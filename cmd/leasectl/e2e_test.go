package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest"
)

// These tests run the built binary (and, for the race detector, run in-process) against a real
// in-process three-node cluster.

func TestCluster(t *testing.T) {
	// A 300 ms election timeout rather than the test default's 100 ms: nothing here needs a fast
	// failover, and the benches want no error at all, which an election on a busy machine (a chaos run
	// beside CI lost this cluster its leader during bench keepalive) denies them. TTLs down to 3 s stay
	// above the floor (8 election timeouts).
	c := servertest.Start(t, 3, func(cfg *server.Config) { cfg.ElectionTicks = 30 })
	eps := c.Endpoints()
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T, eps []string)
	}{
		{"Lifecycle", testLifecycle},
		{"InProcess", testInProcess},
		{"ListPagesAndAligns", testList},
		{"Status", testStatus},
		{"Watch", testWatch},
		{"RunPassesStatusAndReleases", testRunStatus},
		{"RunHeldExits3", testRunHeld},
		{"RunKillsChildOnLeaseLoss", testRunLeaseLoss},
		{"RunKillsAfterGrace", testRunGraceKill},
		{"ElectAndLeader", testElect},
		{"LeaderWatch", testLeaderWatch},
		{"RequestIDReuseIsRefused", testRequestIDReuse},
		{"SnapshotSaveStatusRestore", testSnapshot},
		{"Members", testMembers},
		{"WaitFeedback", testWaitFeedback},
		{"HeldNamesTheProcess", testHeldNamesTheProcess},
		{"Bench", testBench},
		{"BenchKeepAlive", testBenchKeepAlive},
		{"BenchFailoverQuiet", testBenchFailoverQuiet},
		{"BenchInterrupt", testBenchInterrupt},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, eps) })
	}
}

func mustJSON[T any](t *testing.T, line string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(line), &v); err != nil {
		t.Fatalf("not JSON: %v: %q", err, line)
	}
	return v
}

func want(t *testing.T, r result, code int) result {
	t.Helper()
	if r.code != code {
		t.Fatalf("want exit %d, got %v", code, r)
	}
	return r
}

func testLifecycle(t *testing.T, eps []string) {
	acq := want(t, ctl(t, eps, "-o", "json", "acquire", "life/a", "--ttl", "30s", "--holder", "alice", "--value", "v1"), 0)
	lease := mustJSON[leaseJSON](t, acq.stdout)
	if lease.Resource != "life/a" || lease.Holder != "alice" || lease.Token == 0 || lease.TTLMs != 30000 || lease.Value != "v1" {
		t.Fatalf("acquire: %+v", lease)
	}
	tok := strconv.FormatUint(lease.Token, 10)

	got := mustJSON[infoJSON](t, want(t, ctl(t, eps, "-o", "json", "get", "life/a"), 0).stdout)
	if got.Holder != "alice" || got.Token != lease.Token || got.Value != "v1" || got.RemainingMs <= 0 || got.RemainingMs > 30000 {
		t.Fatalf("get: %+v", got)
	}

	renew := mustJSON[map[string]any](t, want(t, ctl(t, eps, "-o", "json", "renew", "life/a", "--token", tok), 0).stdout)
	if renew["ttl_ms"] != float64(30000) {
		t.Fatalf("renew: %v", renew)
	}

	// Held by someone else: exit 3, the holder named in plain words and in JSON.
	held := want(t, ctl(t, eps, "acquire", "life/a", "--ttl", "10s", "--holder", "bob"), 3)
	if !strings.Contains(held.stderr, "held by alice") || !strings.Contains(held.stderr, tok) {
		t.Fatalf("held: %v", held)
	}
	heldJSON := mustJSON[map[string]any](t, want(t, ctl(t, eps, "-o", "json", "acquire", "life/a", "--ttl", "10s", "--holder", "bob"), 3).stderr)
	if heldJSON["code"] != float64(3) || heldJSON["holder"] != "alice" {
		t.Fatalf("held JSON: %v", heldJSON)
	}
	// --wait that times out while the resource stays held: still exit 3, naming the holder. Under a
	// second the SDK asks first without waiting, and answers "held" once the cluster said so (only the
	// first answer has to arrive within the timeout); from a second on it sends one waiting request,
	// which the cluster answers "held" when the wait it was given ends, a tenth before the timeout.
	for _, timeout := range []string{"1s", "2s"} {
		waited := want(t, ctl(t, eps, "acquire", "life/a", "--ttl", "10s", "--holder", "bob", "--wait", "--wait-timeout", timeout), 3)
		if !strings.Contains(waited.stderr, "held by alice") {
			t.Fatalf("wait of %s timed out: %v", timeout, waited)
		}
	}

	// The same request id and holder is a retry: the same grant, not "held".
	r1 := mustJSON[leaseJSON](t, want(t, ctl(t, eps, "-o", "json", "acquire", "life/idem", "--ttl", "10s", "--holder", "h", "--request-id", "job-1"), 0).stdout)
	r2 := mustJSON[leaseJSON](t, want(t, ctl(t, eps, "-o", "json", "acquire", "life/idem", "--ttl", "10s", "--holder", "h", "--request-id", "job-1"), 0).stdout)
	if r1.Token != r2.Token {
		t.Fatalf("retry got a new grant: %d then %d", r1.Token, r2.Token)
	}

	want(t, ctl(t, eps, "release", "life/a", "--token", tok), 0)
	notFound := want(t, ctl(t, eps, "get", "life/a"), 4)
	if !strings.Contains(notFound.stderr, "nobody holds") {
		t.Fatalf("get free: %v", notFound)
	}
	want(t, ctl(t, eps, "renew", "life/a", "--token", tok), 4)
	// Releasing again is a retry of a release that took effect: success. A token that never was the
	// grant did not get released: exit 4.
	want(t, ctl(t, eps, "release", "life/a", "--token", tok), 0)
	want(t, ctl(t, eps, "release", "life/a", "--token", "999999"), 4)

	// Server-side validation is a usage error too.
	want(t, ctl(t, eps, "acquire", "/bad//name", "--ttl", "10s"), 2)
}

// testInProcess drives the same commands through run() so the race detector sees the command code.
func testInProcess(t *testing.T, eps []string) {
	ep := strings.Join(eps, ",")
	r := want(t, inProcess("--endpoints", ep, "-o", "json", "acquire", "inproc/a", "--ttl", "10s"), 0)
	lease := mustJSON[leaseJSON](t, r.stdout)
	want(t, inProcess("--endpoints", ep, "get", "inproc/a"), 0)
	want(t, inProcess("--endpoints", ep, "list", "--prefix", "inproc/"), 0)
	want(t, inProcess("--endpoints", ep, "status"), 0)
	want(t, inProcess("--endpoints", ep, "leader", "inproc/a"), 0)
	want(t, inProcess("--endpoints", ep, "acquire", "inproc/a", "--ttl", "10s", "--holder", "other"), 3)
	want(t, inProcess("--endpoints", ep, "release", "inproc/a", "--token", strconv.FormatUint(lease.Token, 10)), 0)
	want(t, inProcess("--endpoints", ep, "get", "inproc/a"), 4)
	want(t, inProcess("--endpoints", ep, "member", "list"), 0)
}

func testList(t *testing.T, eps []string) {
	const n = 5
	for i := range n {
		want(t, ctl(t, eps, "acquire", fmt.Sprintf("list/r%d", i), "--ttl", "30s", "--holder", fmt.Sprintf("holder-%d", i)), 0)
	}
	all := want(t, ctl(t, eps, "-o", "json", "list", "--prefix", "list/"), 0)
	lines := strings.Split(strings.TrimSpace(all.stdout), "\n")
	if len(lines) != n {
		t.Fatalf("want %d lines, got %v", n, all)
	}
	for i, l := range lines {
		info := mustJSON[infoJSON](t, l)
		if info.Resource != fmt.Sprintf("list/r%d", i) || info.Token == 0 {
			t.Fatalf("line %d: %+v", i, info)
		}
	}
	limited := want(t, ctl(t, eps, "-o", "json", "list", "--prefix", "list/", "--limit", "2"), 0)
	if got := strings.Count(limited.stdout, "\n"); got != 2 {
		t.Fatalf("--limit 2 printed %d lines", got)
	}
	// The table is aligned: every column starts where its header does.
	table := want(t, ctl(t, eps, "list", "--prefix", "list/"), 0)
	rows := strings.Split(strings.TrimRight(table.stdout, "\n"), "\n")
	col := strings.Index(rows[0], "HOLDER")
	for _, row := range rows[1:] {
		if !strings.HasPrefix(row[col:], "holder-") {
			t.Fatalf("misaligned table:\n%s", table.stdout)
		}
	}
}

func testStatus(t *testing.T, eps []string) {
	r := want(t, ctl(t, eps, "-o", "json", "status"), 0)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != len(eps) {
		t.Fatalf("want one line per endpoint, got %v", r)
	}
	leaders, names := 0, map[string]bool{}
	var leaderName string
	for _, l := range lines {
		n := mustJSON[nodeJSON](t, l)
		names[n.Name] = true
		if !n.Healthy || n.Term == 0 || n.AppliedIndex == 0 {
			t.Errorf("unhealthy node: %+v", n)
		}
		if n.Role == "leader" {
			leaders++
			leaderName = n.Name
		}
	}
	if leaders != 1 || len(names) != len(eps) {
		t.Fatalf("want one leader among distinct nodes, got %s", r.stdout)
	}
	hexID := regexp.MustCompile(`^[0-9a-f]{16}$`)
	var leaderID string
	for _, l := range lines {
		if n := mustJSON[nodeJSON](t, l); n.Role == "leader" {
			leaderID = n.ID
		}
	}
	for _, l := range lines {
		if n := mustJSON[nodeJSON](t, l); n.Leader != leaderName || n.LeaderID != leaderID {
			t.Errorf("%s follows %q (%s), the leader is %q (%s)", n.Name, n.Leader, n.LeaderID, leaderName, leaderID)
		}
		// Ids are JSON strings of 16 lower-case hex digits, never numbers (jq rounds those above 2^53).
		raw := mustJSON[map[string]any](t, l)
		for _, k := range []string{"id", "leader_id"} {
			if v, ok := raw[k].(string); !ok || !hexID.MatchString(v) {
				t.Errorf("%s is %#v, want a string of 16 hex digits: %s", k, raw[k], l)
			}
		}
	}
	// One endpoint that nothing listens on is a row, not a failure.
	r = want(t, ctl(t, append([]string{dead}, eps...), "-o", "json", "status"), 0)
	first := mustJSON[nodeJSON](t, strings.SplitN(r.stdout, "\n", 2)[0])
	if first.Role != "unreachable" || first.Healthy || first.ClientAddr != dead || first.ID != "" {
		t.Fatalf("unreachable row: %+v", first)
	}
	table := want(t, ctl(t, eps, "status"), 0)
	if !strings.Contains(table.stdout, "NAME") || !strings.Contains(table.stdout, "leader") || !strings.Contains(table.stdout, leaderID) {
		t.Fatalf("status table: %v", table)
	}
}

// lineReader delivers a process's stdout lines on a channel.
func lineReader(r io.Reader) <-chan string {
	ch := make(chan string, 64)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			ch <- sc.Text()
		}
	}()
	return ch
}

func nextLine(t *testing.T, lines <-chan string, d time.Duration) string {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case l, ok := <-lines:
		if !ok {
			t.Fatal("stream ended")
		}
		return l
	case <-timer.C:
		t.Fatalf("no line within %v", d)
	}
	return ""
}

// waitExit waits for cmd (started) to exit, bounded by d.
func waitExit(t *testing.T, cmd *exec.Cmd, d time.Duration) int {
	t.Helper()
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-done:
		return cmd.ProcessState.ExitCode()
	case <-timer.C:
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("%v did not exit within %v", cmd.Args, d)
	}
	return -1
}

func testWatch(t *testing.T, eps []string) {
	first := mustJSON[leaseJSON](t, want(t, ctl(t, eps, "-o", "json", "acquire", "watch/a", "--ttl", "30s"), 0).stdout)
	// Start at the first grant's index, so no event can slip by before the stream is up.
	cmd := exec.Command(bin, "--endpoints", strings.Join(eps, ","), "-o", "json", "watch", "--prefix", "watch/",
		"--from-index", strconv.FormatUint(first.Token, 10))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := lineReader(out)

	ev := mustJSON[eventJSON](t, nextLine(t, lines, 10*time.Second))
	if ev.Type != "granted" || ev.Resource != "watch/a" || ev.Token != first.Token || ev.Index != first.Token {
		t.Fatalf("first event: %+v", ev)
	}
	if at, err := time.Parse(timestampLayout, ev.Time); err != nil || time.Since(at) > time.Minute || time.Until(at) > time.Second {
		t.Fatalf("event time %q: %v", ev.Time, err)
	}
	want(t, ctl(t, eps, "release", "watch/a", "--token", strconv.FormatUint(first.Token, 10)), 0)
	ev = mustJSON[eventJSON](t, nextLine(t, lines, 10*time.Second))
	if ev.Type != "released" || ev.Resource != "watch/a" || ev.Index <= first.Token {
		t.Fatalf("second event: %+v", ev)
	}
	second := mustJSON[leaseJSON](t, want(t, ctl(t, eps, "-o", "json", "acquire", "watch/b", "--ttl", "30s", "--holder", "w"), 0).stdout)
	ev = mustJSON[eventJSON](t, nextLine(t, lines, 10*time.Second))
	if ev.Type != "granted" || ev.Resource != "watch/b" || ev.Holder != "w" || ev.Token != second.Token {
		t.Fatalf("third event: %+v", ev)
	}
	// Other prefixes are not delivered; SIGINT ends the stream with exit 0.
	want(t, ctl(t, eps, "acquire", "other/x", "--ttl", "30s"), 0)
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	for l := range lines {
		if strings.Contains(l, "other/x") {
			t.Errorf("event outside the prefix: %s", l)
		}
	}
	if code := waitExit(t, cmd, 10*time.Second); code != 0 {
		t.Fatalf("watch exited %d after SIGINT: %s", code, stderr.String())
	}

	// The table: a timestamp first, the value last. From the grant's index, so it is the first event.
	tl := mustJSON[leaseJSON](t, want(t, ctl(t, eps, "-o", "json", "acquire", "watch/t", "--ttl", "30s", "--value", "10.0.0.9:80"), 0).stdout)
	table := exec.Command(bin, "--endpoints", strings.Join(eps, ","), "watch", "watch/t", "--from-index", strconv.FormatUint(tl.Token, 10))
	tout, err := table.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := table.Start(); err != nil {
		t.Fatal(err)
	}
	tlines := lineReader(tout)
	if f := strings.Fields(nextLine(t, tlines, 10*time.Second)); len(f) != 7 || f[0] != "TIME" || f[6] != "VALUE" {
		t.Fatalf("watch table header %q", f)
	}
	row := nextLine(t, tlines, 10*time.Second)
	f := strings.Fields(row)
	if _, err := time.Parse(timestampLayout, f[0]); err != nil || f[2] != "granted" || f[len(f)-1] != "10.0.0.9:80" {
		t.Fatalf("watch table row %q: %v", row, err)
	}
	if err := table.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	for range tlines {
	}
	if code := waitExit(t, table, 10*time.Second); code != 0 {
		t.Fatalf("watch (table) exited %d after SIGINT", code)
	}
}

func testRunStatus(t *testing.T, eps []string) {
	dir := t.TempDir()
	envFile := filepath.Join(dir, "env")
	r := ctl(t, eps, "run", "run/status", "--ttl", "10s", "--holder", "cron-1", "--",
		"sh", "-c", `echo "$LEASE_RESOURCE $LEASE_TOKEN $LEASE_HOLDER" > "$0"; echo out; echo err >&2; exit 7`, envFile)
	want(t, r, 7)
	if r.stdout != "out\n" || r.stderr != "err\n" {
		t.Fatalf("streams not passed through: %v", r)
	}
	env, err := os.ReadFile(envFile)
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(env))
	if len(f) != 3 || f[0] != "run/status" || f[2] != "cron-1" {
		t.Fatalf("environment: %q", env)
	}
	if tok, err := strconv.ParseUint(f[1], 10, 64); err != nil || tok == 0 {
		t.Fatalf("LEASE_TOKEN %q", f[1])
	}
	// Released when the command exited.
	want(t, ctl(t, eps, "get", "run/status"), 4)
	// A command that cannot start: 127, like a shell, and the lease is released.
	want(t, ctl(t, eps, "run", "run/status", "--ttl", "10s", "--", "/nonexistent/command"), 127)
	want(t, ctl(t, eps, "get", "run/status"), 4)
}

func testRunHeld(t *testing.T, eps []string) {
	want(t, ctl(t, eps, "acquire", "run/held", "--ttl", "30s", "--holder", "someone"), 0)
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	r := want(t, ctl(t, eps, "run", "run/held", "--ttl", "10s", "--", "touch", marker), 3)
	if _, err := os.Stat(marker); err == nil {
		t.Fatalf("the command ran although the lease was held: %v", r)
	}
	if !strings.Contains(r.stderr, "held by someone") {
		t.Fatalf("run held: %v", r)
	}
}

// waitFile polls for a file's content, bounded by d.
func waitFile(t *testing.T, path string, d time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if b, err := os.ReadFile(path); err == nil && len(b) > 0 && b[len(b)-1] == '\n' {
			return strings.TrimSpace(string(b))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not written within %v", path, d)
		}
		<-tick.C
	}
}

func testRunLeaseLoss(t *testing.T, eps []string) {
	dir := t.TempDir()
	tokenFile, termFile := filepath.Join(dir, "token"), filepath.Join(dir, "term")
	// The trap is set before the token is published, so a release cannot beat it.
	script := `trap 'echo term > "$1"; kill $pid; exit 143' TERM
sleep 30 & pid=$!
echo "$LEASE_TOKEN" > "$0.tmp" && mv "$0.tmp" "$0"
wait $pid`
	cmd := exec.Command(bin, "--endpoints", strings.Join(eps, ","), "run", "run/lost", "--ttl", "3s", "--grace", "10s",
		"--", "sh", "-c", script, tokenFile, termFile)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	token := waitFile(t, tokenFile, 10*time.Second)
	// Lose the lease: another leasectl releases it with the child's token.
	want(t, ctl(t, eps, "release", "run/lost", "--token", token), 0)
	if code := waitExit(t, cmd, 15*time.Second); code != exitNotFound {
		t.Fatalf("run exited %d, want %d (lease gone): %s", code, exitNotFound, stderr.String())
	}
	if got := waitFile(t, termFile, time.Second); got != "term" {
		t.Fatalf("the child did not get SIGTERM: %q", got)
	}
	if !strings.Contains(stderr.String(), "lost") {
		t.Fatalf("stderr does not explain: %s", stderr.String())
	}
}

func testRunGraceKill(t *testing.T, eps []string) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	// The child ignores SIGTERM (inherited across exec), so only SIGKILL after --grace stops it.
	script := `trap '' TERM; echo "$LEASE_TOKEN" > "$0.tmp" && mv "$0.tmp" "$0"; exec sleep 30`
	cmd := exec.Command(bin, "--endpoints", strings.Join(eps, ","), "run", "run/grace", "--ttl", "3s", "--grace", "300ms",
		"--", "sh", "-c", script, tokenFile)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	token := waitFile(t, tokenFile, 10*time.Second)
	want(t, ctl(t, eps, "release", "run/grace", "--token", token), 0)
	if code := waitExit(t, cmd, 15*time.Second); code != exitNotFound {
		t.Fatalf("run exited %d: %s", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), "SIGKILL") {
		t.Fatalf("no SIGKILL reported: %s", stderr.String())
	}
}

func testElect(t *testing.T, eps []string) {
	want(t, ctl(t, eps, "leader", "elect/svc"), 4)
	dir := t.TempDir()
	started := filepath.Join(dir, "started")
	script := `trap 'kill $pid; exit 0' TERM
sleep 30 & pid=$!
echo "$LEASE_VALUE" > "$0.tmp" && mv "$0.tmp" "$0"
wait $pid`
	cmd := exec.Command(bin, "--endpoints", strings.Join(eps, ","), "elect", "elect/svc", "--value", "node-a", "--ttl", "5s",
		"--holder", "a", "--", "sh", "-c", script, started)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if got := waitFile(t, started, 10*time.Second); got != "node-a" {
		t.Fatalf("LEASE_VALUE %q", got)
	}
	li := mustJSON[leaderJSON](t, want(t, ctl(t, eps, "-o", "json", "leader", "elect/svc"), 0).stdout)
	if li.Holder != "a" || li.Value != "node-a" || li.Token == 0 {
		t.Fatalf("leader: %+v", li)
	}
	// SIGTERM to leasectl is forwarded; the command exits 0, elect resigns and exits 0.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, cmd, 10*time.Second); code != 0 {
		t.Fatalf("elect exited %d: %s", code, stderr.String())
	}
	want(t, ctl(t, eps, "leader", "elect/svc"), 4)
}

// memberLine is one line of member list -o json.
type memberLine struct {
	ID         string `json:"id"`
	Name       string `json:"name"`
	PeerAddr   string `json:"peer_addr"`
	ClientAddr string `json:"client_addr"`
	IsLearner  bool   `json:"is_learner"`
	IsLeader   bool   `json:"is_leader"`
}

func memberLines(t *testing.T, eps []string) map[string]memberLine {
	t.Helper()
	out := map[string]memberLine{}
	for _, line := range strings.Split(strings.TrimSpace(want(t, ctl(t, eps, "-o", "json", "member", "list"), 0).stdout), "\n") {
		m := mustJSON[memberLine](t, line)
		out[m.Name] = m
	}
	return out
}

// testMembers: member list -o json names every member with its addresses and the leader; add, promote
// and remove answer with the documented exit codes.
func testMembers(t *testing.T, eps []string) {
	ms := memberLines(t, eps)
	leaders := 0
	for _, name := range []string{"n1", "n2", "n3"} {
		m, ok := ms[name]
		if !ok || len(m.ID) != 16 || m.PeerAddr == "" || m.IsLearner {
			t.Fatalf("member %s: %+v (all: %v)", name, m, ms)
		}
		if m.IsLeader {
			leaders++
		}
	}
	if leaders != 1 || len(ms) != 3 {
		t.Fatalf("want 3 members and 1 leader: %v", ms)
	}
	r := want(t, ctl(t, eps, "member", "add", "n4", "--peer-addr", "127.0.0.1:7204"), 0)
	if !strings.Contains(r.stdout, "n4") || !strings.Contains(r.stderr, "--initial-cluster-state existing") {
		t.Errorf("member add: %v", r)
	}
	if m := memberLines(t, eps)["n4"]; !m.IsLearner || m.PeerAddr != "127.0.0.1:7204" {
		t.Fatalf("n4 after add: %+v", m)
	}
	want(t, ctl(t, eps, "member", "add", "n4", "--peer-addr", "127.0.0.1:7205"), 1) // AlreadyExists
	want(t, ctl(t, eps, "member", "add", "n5", "--peer-addr", "0.0.0.0:7205"), 2)   // InvalidArgument
	want(t, ctl(t, eps, "member", "promote", "n4"), 3)                              // not caught up: FailedPrecondition
	want(t, ctl(t, eps, "member", "remove", "nosuch"), 4)                           // NotFound
	want(t, ctl(t, eps, "member", "remove", memberLines(t, eps)["n4"].ID), 0)       // by id
	if _, ok := memberLines(t, eps)["n4"]; ok {
		t.Fatal("n4 still listed after remove")
	}
}

func TestUnavailableClusterExits5WithinTimeout(t *testing.T) {
	nobody := []string{"127.0.0.1:1", "127.0.0.1:2"}
	for _, args := range [][]string{
		{"get", "x"},
		{"acquire", "x", "--ttl", "10s"},
		{"renew", "x", "--token", "1"},
		{"release", "x", "--token", "1"}, // never sent, so not "outcome unknown" (6)
		{"list"},
		{"status"},
		{"watch"},
		{"run", "x", "--ttl", "10s", "--", "true"},
		{"member", "list"},
	} {
		r := ctl(t, nobody, append([]string{"--timeout", "1s"}, args...)...)
		if r.code != exitUnavailable {
			t.Errorf("%v: want exit 5, got %v", args, r)
		}
		if r.elapsed > 3*time.Second {
			t.Errorf("%v: took %v with --timeout 1s", args, r.elapsed)
		}
	}
}

func testLeaderWatch(t *testing.T, eps []string) {
	cmd := exec.Command(bin, "--endpoints", strings.Join(eps, ","), "-o", "json", "leader", "obs/svc", "--watch")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := lineReader(out)
	if li := mustJSON[leaderJSON](t, nextLine(t, lines, 10*time.Second)); li.Holder != "" {
		t.Fatalf("want no leader yet, got %+v", li)
	} else if _, err := time.Parse(timestampLayout, li.Time); err != nil {
		t.Fatalf("leader --watch line without a time: %+v: %v", li, err)
	}
	lease := mustJSON[leaseJSON](t, want(t, ctl(t, eps, "-o", "json", "acquire", "obs/svc", "--ttl", "30s", "--holder", "b", "--value", "node-b"), 0).stdout)
	li := mustJSON[leaderJSON](t, nextLine(t, lines, 10*time.Second))
	if li.Holder != "b" || li.Value != "node-b" || li.Token != lease.Token {
		t.Fatalf("new leader: %+v", li)
	}
	want(t, ctl(t, eps, "release", "obs/svc", "--token", strconv.FormatUint(lease.Token, 10)), 0)
	if li := mustJSON[leaderJSON](t, nextLine(t, lines, 10*time.Second)); li.Holder != "" {
		t.Fatalf("want no leader after release, got %+v", li)
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	for range lines {
	}
	if code := waitExit(t, cmd, 10*time.Second); code != 0 {
		t.Fatalf("leader --watch exited %d after SIGINT", code)
	}
}
