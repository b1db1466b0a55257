package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leased/leased/api/leasepb"
)

// A member whose data dir is lost and that is started again with its founding flags (a StatefulSet after
// a lost volume) must never sit as a voter with an empty log: docs/operations.md, "Replace a failed
// node".

// wipedCluster starts three nodes, waits until every member has announced its client address (every one
// has run), acquires a long lease and returns it; then kills node i and wipes its data dir.
func wipedCluster(t *testing.T, i int) (*cluster, *leasepb.Lease, map[string]memberRow) {
	c := newCluster(t, 3)
	c.eventually(10*time.Second, "every client address in the table", func() bool {
		rows := memberList(t, c.running())
		for _, r := range rows {
			if r.ClientAddr == "" {
				return false
			}
		}
		return len(rows) == 3
	})
	before := memberList(t, c.running())
	var lease *leasepb.Lease
	c.eventually(10*time.Second, "a lease acquired before the wipe", func() bool {
		ld, _ := c.Leader(context.Background())
		if ld < 0 {
			return false
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		resp, err := c.Leases(ld).Acquire(ctx, &leasepb.AcquireRequest{Resource: "wiped/before", Holder: "h", TtlMs: 120000, RequestId: "before"})
		lease = resp.GetLease()
		return err == nil
	})
	c.Kill(i)
	if err := os.RemoveAll(c.Nodes[i].DataDir); err != nil {
		t.Fatal(err)
	}
	return c, lease, before
}

// TestWipedMemberRefusesToStart: n3 loses its data dir and is started again with its founding flags: it
// refuses (exit 1) with a message naming the runbook, and leaves its data dir and the member table alone.
func TestWipedMemberRefusesToStart(t *testing.T) {
	c, _, before := wipedCluster(t, 2)
	n := c.Nodes[2]
	c.Start(2)
	if !c.waitExit(2, 20*time.Second) {
		t.Fatal("n3 started on an empty data dir although the cluster knows it as a member that ran")
	}
	if code := c.Stop(2, syscall.SIGTERM, time.Second); code != 1 {
		t.Errorf("exit code %d, want 1", code)
	}
	for _, want := range []string{"data dir was lost", `"Replace a failed node" in docs/operations.md`, "--auto-rejoin"} {
		if !logHas(t, n.LogPath, want) {
			t.Errorf("n3's refusal does not say %q:\n%s", want, tail(n.LogPath, 5))
		}
	}
	if _, err := os.Stat(filepath.Join(n.DataDir, "raft.db")); err == nil {
		t.Error("the refused start wrote raft.db")
	}
	after := memberList(t, c.running())
	b, a := before["n3"], after["n3"]
	b.IsLeader, a.IsLeader = false, false // n3 may have led before it was killed
	if a != b {
		t.Errorf("the refused start changed n3's record: %+v -> %+v", before["n3"], after["n3"])
	}
}

// TestWipedMemberAutoRejoins: with --auto-rejoin, the wiped n3 is added again under a new raft id, catches
// up (it holds the lease acquired before the wipe) and is promoted; the cluster then loses another node and
// still grants.
func TestWipedMemberAutoRejoins(t *testing.T) {
	c, lease, before := wipedCluster(t, 2)
	c.Nodes[2].Args = []string{"--auto-rejoin"}
	c.Start(2)
	var row memberRow
	c.eventually(promoteWithin, "n3 a voter under a new raft id", func() bool {
		row = memberList(t, c.running())["n3"]
		return row.Name == "n3" && row.ID != before["n3"].ID && !row.IsLearner
	})
	t.Logf("n3 rejoined: raft id %s (was %s)", row.ID, before["n3"].ID)
	if !logHas(t, c.Nodes[2].LogPath, "asking to be added again under a new raft id") {
		t.Errorf("n3's log does not say it rejoined:\n%s", tail(c.Nodes[2].LogPath, 10))
	}
	c.eventually(10*time.Second, "n3 holds the lease acquired before the wipe", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		resp, err := c.Leases(2).Get(ctx, &leasepb.GetRequest{Resource: "wiped/before", Serializable: true})
		return err == nil && resp.GetLease().GetToken() == lease.GetToken()
	})
	if rows := memberList(t, c.running()); len(rows) != 3 {
		t.Fatalf("members after the rejoin: %v", rows)
	}

	// Three voters again: losing n1 leaves n2 and n3, a quorum.
	c.Kill(0)
	c.eventually(20*time.Second, "a grant with n1 down", func() bool {
		for _, i := range []int{1, 2} {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := c.Leases(i).Acquire(ctx, &leasepb.AcquireRequest{Resource: "wiped/after", Holder: "h", TtlMs: 10000, RequestId: "after"})
			cancel()
			if err == nil {
				return true
			}
		}
		return false
	})
}

// TestRemovedNameAddedAgain: n3 is removed, added again under the same name and peer address, and started
// on an empty data dir with its founding flags (the Kubernetes way): it joins under a new raft id and is
// promoted. Its old id stays retired.
func TestRemovedNameAddedAgain(t *testing.T) {
	c, lease, before := wipedCluster(t, 2)
	c.waitLeader(10*time.Second, 2)
	ctlOK(t, c.running(), "member", "remove", "n3")
	out := ctlOK(t, c.running(), "member", "add", "n3", "--peer-addr", c.Nodes[2].PeerAddr)
	if strings.Contains(out, before["n3"].ID) {
		t.Fatalf("n3 added again under its old raft id:\n%s", out)
	}
	c.Start(2)
	var row memberRow
	c.eventually(promoteWithin, "n3 a voter again", func() bool {
		row = memberList(t, c.running())["n3"]
		return row.Name == "n3" && !row.IsLearner && row.ClientAddr == c.Nodes[2].ClientAddr
	})
	if row.ID == before["n3"].ID {
		t.Errorf("n3 came back under its retired raft id %s", row.ID)
	}
	c.eventually(10*time.Second, "n3 holds the lease acquired before", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		resp, err := c.Leases(2).Get(ctx, &leasepb.GetRequest{Resource: "wiped/before", Serializable: true})
		return err == nil && resp.GetLease().GetToken() == lease.GetToken()
	})
	if !c.Running(2) {
		t.Fatal("n3 stopped")
	}
}

// TestWipedJoinedMember: n4, added with member add and started with --initial-cluster-state existing,
// loses its data dir and is started again with those flags: refused, naming the runbook; with
// --auto-rejoin, a voter again under a new raft id.
func TestWipedJoinedMember(t *testing.T) {
	c := newCluster(t, 3)
	i := c.join("n4", "n1", "n2", "n3")
	old := memberList(t, c.running())["n4"]
	c.Kill(i)
	if err := os.RemoveAll(c.Nodes[i].DataDir); err != nil {
		t.Fatal(err)
	}
	c.Start(i)
	if !c.waitExit(i, 20*time.Second) {
		t.Fatal("the wiped n4 started with its join flags")
	}
	if !logHas(t, c.Nodes[i].LogPath, `data dir was lost`) || !logHas(t, c.Nodes[i].LogPath, `"Replace a failed node" in docs/operations.md`) {
		t.Errorf("n4's refusal:\n%s", tail(c.Nodes[i].LogPath, 5))
	}
	c.Nodes[i].Args = append(c.Nodes[i].Args, "--auto-rejoin")
	c.Start(i)
	c.eventually(promoteWithin, "n4 a voter under a new raft id", func() bool {
		r := memberList(t, c.running())["n4"]
		return r.Name == "n4" && r.ID != old.ID && !r.IsLearner
	})
}
