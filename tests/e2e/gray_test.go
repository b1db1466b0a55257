package e2e

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leased/leased/api/leasepb"
)

// Gray failures with leased's default timing (100 ms ticks, a 1 s election timeout), as a user meets them
// (issue #11): a frozen leader must not cost a healthy holder its lease, and a frozen endpoint must not
// stall a client that has other endpoints.

// defaultTiming overrides the test clusters' fast timing with leased's defaults.
var defaultTiming = []string{"--election-timeout=1s", "--checkpoint-interval=5s", "--proposal-timeout=5s"}

// leasectl starts the CLI against endpoints; the caller waits for it.
func leasectl(t *testing.T, endpoints []string, args ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(leasectlBin, append([]string{"--endpoints", strings.Join(endpoints, ",")}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, &out
}

// TestRunSurvivesAFrozenLeader: `leasectl run r --ttl 10s -- sleep 20` across a 12 s SIGSTOP of the leader
// exits 0 with its child never signalled. The SDK used to keep renewing on the frozen node's stream and
// report the lease lost about 8 s into the freeze.
func TestRunSurvivesAFrozenLeader(t *testing.T) {
	c := newCluster(t, 3, defaultTiming...)
	leader, _ := c.waitLeader(15*time.Second, -1)
	run, out := leasectl(t, c.Endpoints(), "run", "gray/frozen-leader", "--ttl", "10s", "--", "sleep", "20")
	exited := make(chan error, 1)
	go func() { exited <- run.Wait() }()
	c.eventually(10*time.Second, "the run's lease", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := c.Leases(leader).Get(ctx, &leasepb.GetRequest{Resource: "gray/frozen-leader"})
		return err == nil
	})
	c.Signal(leader, syscall.SIGSTOP)
	freeze := time.NewTimer(12 * time.Second) // the length of the fault, not a wait for a condition
	select {
	case err := <-exited:
		c.Signal(leader, syscall.SIGCONT)
		t.Fatalf("leasectl run ended during the freeze: %v\n%s", err, out)
	case <-freeze.C:
	}
	c.Signal(leader, syscall.SIGCONT)
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("leasectl run: %v (want exit 0)\n%s", err, out)
		}
	case <-time.After(30 * time.Second):
		_ = run.Process.Kill()
		<-exited
		t.Fatalf("leasectl run did not end after its child's 20 s\n%s", out)
	}
}

// TestAcquireWithAFrozenFirstEndpointAnswersQuickly: with the first endpoint a frozen follower, an
// acquire answers from the others within 2 s. It used to wait out its whole --timeout on the first.
func TestAcquireWithAFrozenFirstEndpointAnswersQuickly(t *testing.T) {
	c := newCluster(t, 3, defaultTiming...)
	leader, _ := c.waitLeader(15*time.Second, -1)
	follower := (leader + 1) % len(c.Nodes)
	c.Signal(follower, syscall.SIGSTOP)
	defer c.Signal(follower, syscall.SIGCONT)
	eps := []string{c.Nodes[follower].ClientAddr}
	for i, n := range c.Nodes {
		if i != follower {
			eps = append(eps, n.ClientAddr)
		}
	}
	start := time.Now()
	cmd, out := leasectl(t, eps, "--timeout", "5s", "acquire", "gray/frozen-first", "--ttl", "10s")
	err := cmd.Wait()
	took := time.Since(start)
	if err != nil {
		t.Fatalf("acquire with a frozen first endpoint: %v\n%s", err, out)
	}
	if took > 2*time.Second {
		t.Fatalf("acquire with a frozen first endpoint took %v, want at most 2s\n%s", took, out)
	}
	t.Logf("answered in %v", took)
}

// TestRenewThroughAFollowerOutlivesAFrozenLeader: a renewal sent to a follower just after the leader
// froze is answered once the others elect a new leader. The follower used to forward it to the frozen
// leader and wait there until the caller's deadline (a soak lost a lease that way: its holder's renewal
// went to a node that was forwarding to a leader whose disk had stalled).
func TestRenewThroughAFollowerOutlivesAFrozenLeader(t *testing.T) {
	c := newCluster(t, 3, defaultTiming...)
	leader, _ := c.waitLeader(15*time.Second, -1)
	follower := (leader + 1) % len(c.Nodes)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	acq, err := c.Leases(leader).Acquire(ctx, &leasepb.AcquireRequest{Resource: "gray/renew-via-follower", Holder: "h", TtlMs: 60_000})
	if err != nil {
		t.Fatal(err)
	}
	// The follower knows the grant, so it forwards the renewal rather than refuse it as unknown.
	c.eventually(10*time.Second, "the follower applied the grant", func() bool {
		st, err := c.Status(ctx, follower)
		return err == nil && st.GetAppliedIndex() >= acq.GetLease().GetToken()
	})
	c.Signal(leader, syscall.SIGSTOP)
	defer c.Signal(leader, syscall.SIGCONT)
	// A deadline far beyond an election (1 s here): without following the new leader the call would
	// wait on the frozen one all that time and fail.
	rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
	defer rcancel()
	start := time.Now()
	_, err = c.Leases(follower).Renew(rctx, &leasepb.RenewRequest{Resource: "gray/renew-via-follower", Token: acq.GetLease().GetToken()})
	if err != nil {
		t.Fatalf("renew through the follower after %v: %v, want it renewed by the new leader", time.Since(start).Round(time.Millisecond), err)
	}
	t.Logf("renewed through the follower %v after the leader froze", time.Since(start).Round(time.Millisecond))
}
