package e2e

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/leased/leased/client"
	"github.com/leased/leased/tests/internal/proc"
)

// TestRollingUpgrade is the runbook of docs/operations.md, "Rolling upgrade", against real processes: a
// cluster of the latest release (proc.LatestRelease; skipped before the first tag) is upgraded to this
// build (with another version) — every node in turn is stopped with SIGTERM and started on the new
// binary, and the next waits until it is ready and caught up, so for a while both builds run and must
// exchange raft messages. A lease held through the SDK all along survives with its token, and every node
// reports the new version at the end.
func TestRollingUpgrade(t *testing.T) {
	release := proc.LatestRelease(t)
	c := prepareCluster(t, 3)
	previous, err := proc.BuildRevision(t.TempDir(), release, "", release)
	if err != nil {
		t.Fatalf("build release %s: %v", release, err)
	}
	c.SetBinary(previous)
	for i := range c.Nodes {
		c.Start(i)
	}
	c.waitLeader(10*time.Second, -1)
	for i := range c.Nodes {
		// A node may still be starting once the others elected a leader.
		c.eventually(15*time.Second, c.Nodes[i].Name+" up on "+release, func() bool {
			st, err := c.status(i)
			return err == nil && st.GetVersion() == release
		})
	}
	next, err := proc.BuildVersion(t.TempDir(), "v99.0.0-next")
	if err != nil {
		t.Fatalf("build the new version: %v", err)
	}

	cl, err := client.New(client.Config{Endpoints: c.Endpoints(), Holder: "upgrader", RequestTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	lease, err := cl.Acquire(ctx, "upgrade/held", client.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())

	c.SetBinary(next)
	for i := range c.Nodes {
		if code := c.stop(i); code != 0 {
			t.Fatalf("%s exited %d on SIGTERM", c.Nodes[i].Name, code)
		}
		c.Start(i)
		_, leader := c.waitLeader(15*time.Second, -1)
		c.eventually(15*time.Second, c.Nodes[i].Name+" ready and caught up", func() bool {
			st, err := c.status(i)
			return err == nil && c.readyz(i) == http.StatusOK && st.GetAppliedIndex() >= leader.GetCommitIndex()
		})
		// A write now, and every node must apply it, not only the one restarted: the nodes of each
		// build must hear from the other's, whichever leads.
		step, err := cl.Acquire(ctx, fmt.Sprintf("upgrade/after-%s", c.Nodes[i].Name), client.WithTTL(2*time.Second))
		if err != nil {
			t.Fatalf("acquire after %s restarted: %v", c.Nodes[i].Name, err)
		}
		c.eventually(15*time.Second, "every node applied the write after "+c.Nodes[i].Name+" restarted", func() bool {
			for j := range c.Nodes {
				if st, err := c.status(j); err != nil || st.GetAppliedIndex() < step.Token() {
					return false
				}
			}
			return true
		})
		if err := step.Release(ctx); err != nil {
			t.Fatalf("release after %s restarted: %v", c.Nodes[i].Name, err)
		}
		select {
		case <-lease.Done():
			t.Fatalf("the lease ended while %s restarted: %v", c.Nodes[i].Name, lease.Err())
		default:
		}
	}
	for i := range c.Nodes {
		st, err := c.status(i)
		if err != nil || st.GetVersion() != "v99.0.0-next" {
			t.Fatalf("%s reports version %q after the upgrade (%v)", c.Nodes[i].Name, st.GetVersion(), err)
		}
	}
	info, err := cl.Get(ctx, "upgrade/held")
	if err != nil || info.Token != lease.Token() || info.Holder != "upgrader" {
		t.Fatalf("after the upgrade: %+v, %v; want token %d held by upgrader", info, err, lease.Token())
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("release after the upgrade: %v", err)
	}
}
