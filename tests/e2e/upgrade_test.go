package e2e

import (
	"context"
	"net/http"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/leased/leased/client"
)

// TestRollingUpgrade is the runbook of docs/operations.md, "Rolling upgrade", against real processes:
// every node in turn is stopped with SIGTERM and started on a new binary (built with another version),
// and the next waits until it is ready and caught up. A lease held through the SDK all along survives
// with its token, and every node reports the new version at the end.
func TestRollingUpgrade(t *testing.T) {
	c := newCluster(t, 3)
	next := filepath.Join(t.TempDir(), "leased-next")
	build := exec.Command("go", "build", "-o", next, "-ldflags",
		"-X github.com/leased/leased/cmd/internal/buildinfo.version=v99.0.0-next", "github.com/leased/leased/cmd/leased")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the new version: %v\n%s", err, out)
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
