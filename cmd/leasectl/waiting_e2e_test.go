package main

import (
	"bufio"
	"io"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// startCtl starts the built binary against eps; its stderr lines arrive on the returned channel.
func startCtl(t *testing.T, eps []string, args ...string) (*exec.Cmd, *strings.Builder, <-chan string) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"--endpoints", strings.Join(eps, ",")}, args...)...)
	var stdout strings.Builder
	cmd.Stdout = &stdout
	errPipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return cmd, &stdout, stderrLines(errPipe)
}

func stderrLines(r io.Reader) <-chan string {
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

var waitingLine = regexp.MustCompile(`^leasectl: waiting for (\S+): held by (\S+), token (\d+), ([0-9.]+m?s) left$`)

// nextWaiting reads the next "waiting for" line and checks it names holder and token.
func nextWaiting(t *testing.T, lines <-chan string, resource, holder string, token uint64) {
	t.Helper()
	l := nextLine(t, lines, 15*time.Second)
	m := waitingLine.FindStringSubmatch(l)
	if m == nil || m[1] != resource || m[2] != holder || m[3] != strconv.FormatUint(token, 10) {
		t.Fatalf("want 'waiting for %s: held by %s, token %d, ... left', got %q", resource, holder, token, l)
	}
}

// pollHolder polls get until one of holders holds resource, and returns that lease.
func pollHolder(t *testing.T, eps []string, resource string, holders ...string) infoJSON {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if r := ctl(t, eps, "-o", "json", "get", resource); r.code == 0 {
			info := mustJSON[infoJSON](t, r.stdout)
			for _, h := range holders {
				if info.Holder == h {
					return info
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("none of %v holds %s within 15s", holders, resource)
		}
		<-tick.C
	}
}

// acquire --wait, run --wait and elect say whom they wait for when they start waiting and at every change
// of holder; acquire --wait stays silent when it gets the lease at once.
func testWaitFeedback(t *testing.T, eps []string) {
	alice := mustJSON[leaseJSON](t, want(t, ctl(t, eps, "-o", "json", "acquire", "wait/a", "--ttl", "30s", "--holder", "alice"), 0).stdout)

	// bob and carol wait; alice's release hands the lease to one of them, which the other reports.
	type waiter struct {
		name string
		cmd  *exec.Cmd
		out  *strings.Builder
		errs <-chan string
	}
	var ws []waiter
	for _, name := range []string{"bob", "carol"} {
		cmd, out, errs := startCtl(t, eps, "-o", "json", "acquire", "wait/a", "--ttl", "30s", "--holder", name, "--wait")
		nextWaiting(t, errs, "wait/a", "alice", alice.Token)
		ws = append(ws, waiter{name, cmd, out, errs})
	}
	want(t, ctl(t, eps, "release", "wait/a", "--token", strconv.FormatUint(alice.Token, 10)), 0)
	winner := pollHolder(t, eps, "wait/a", "bob", "carol")
	if ws[0].name != winner.Holder {
		ws[0], ws[1] = ws[1], ws[0]
	}
	if code := waitExit(t, ws[0].cmd, 15*time.Second); code != 0 {
		t.Fatalf("%s's acquire --wait exited %d", ws[0].name, code)
	}
	if got := mustJSON[leaseJSON](t, ws[0].out.String()); got.Token != winner.Token {
		t.Fatalf("%s printed %+v, the cluster says %+v", ws[0].name, got, winner)
	}
	loser := ws[1]
	nextWaiting(t, loser.errs, "wait/a", winner.Holder, winner.Token)
	want(t, ctl(t, eps, "release", "wait/a", "--token", strconv.FormatUint(winner.Token, 10)), 0)
	if code := waitExit(t, loser.cmd, 15*time.Second); code != 0 {
		t.Fatalf("%s's acquire --wait exited %d", loser.name, code)
	}
	if mustJSON[leaseJSON](t, loser.out.String()).Holder != loser.name {
		t.Fatalf("%s: %s", loser.name, loser.out.String())
	}
	for l := range loser.errs {
		t.Errorf("%s printed more after the grant: %q", loser.name, l)
	}

	// Granted at once: nothing on stderr.
	r := want(t, ctl(t, eps, "acquire", "wait/free", "--ttl", "10s", "--wait"), 0)
	if r.stderr != "" {
		t.Fatalf("acquire --wait of a free resource printed %q", r.stderr)
	}

	// run --wait and elect report the holder they wait for, too.
	held := mustJSON[leaseJSON](t, want(t, ctl(t, eps, "-o", "json", "acquire", "wait/run", "--ttl", "30s", "--holder", "dave"), 0).stdout)
	run, _, runErr := startCtl(t, eps, "run", "wait/run", "--ttl", "10s", "--wait", "--", "true")
	nextWaiting(t, runErr, "wait/run", "dave", held.Token)
	elect, _, electErr := startCtl(t, eps, "elect", "wait/run", "--value", "v", "--ttl", "10s", "--", "true")
	nextWaiting(t, electErr, "wait/run", "dave", held.Token)
	want(t, ctl(t, eps, "release", "wait/run", "--token", strconv.FormatUint(held.Token, 10)), 0)
	for _, cmd := range []*exec.Cmd{run, elect} {
		if code := waitExit(t, cmd, 20*time.Second); code != 0 {
			t.Fatalf("%v exited %d", cmd.Args, code)
		}
	}
}
