package server

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server/internal/raftnode"
)

// TestCommitNoticesRideOnTheNextAppend: while acquires follow one another, the leader tells its
// followers of each commit in the next append (raft alone would send every follower an empty append at
// every commit: two per acquire here); after the last, it tells them within raftnode.CommitNoticeDelay, without
// waiting for a heartbeat, and they apply it. Virtual time: the acquires take none.
func TestCommitNoticesRideOnTheNextAppend(t *testing.T) {
	runSim(t, 3, nil, func(t *testing.T, c *simCluster) {
		l := c.waitLeader(10 * time.Second)
		leaderID := c.id(l)
		type notice struct {
			at         time.Time
			to, commit uint64
			empty      bool // a commit notice: no entries
		}
		var (
			mu      sync.Mutex
			notices []notice // the appends the leader sent
		)
		c.net.Tap(func(from uint64, m *raftpb.Message) {
			if from == leaderID && m.GetType() == raftpb.MsgApp {
				mu.Lock()
				defer mu.Unlock()
				notices = append(notices, notice{time.Now(), m.GetTo(), m.GetCommit(), len(m.GetEntries()) == 0})
			}
		})
		// told is when follower i was first told of commit by an append (zero: not yet): a commit notice,
		// or an append of entries that went out meanwhile (one the leader's own work proposed) and
		// carried it instead.
		told := func(i int, commit uint64) time.Time {
			mu.Lock()
			defer mu.Unlock()
			for _, nt := range notices {
				if nt.to == c.id(i) && nt.commit >= commit {
					return nt.at
				}
			}
			return time.Time{}
		}
		const n = 40
		for i := range n {
			if _, err := c.leases(l).Acquire(context.Background(), &leasepb.AcquireRequest{
				Resource: fmt.Sprintf("r%d", i), Holder: "h", TtlMs: 60_000}); err != nil {
				t.Fatalf("acquire %d: %v", i, err)
			}
		}
		done, commit := time.Now(), c.node(l).raft.Commit()
		// Raft sends a follower it is probing (one whose append was rejected, say after the network
		// reordered two) at most one append per heartbeat, so no notice either: only the followers it
		// replicates to at the end are held to the delay.
		replicating := map[uint64]bool{}
		for id, pr := range c.node(l).raft.Status().Progress {
			replicating[id] = pr.State == tracker.StateReplicate && !pr.IsPaused()
		}
		mu.Lock()
		during := 0
		for _, nt := range notices {
			if nt.empty {
				during++
			}
		}
		mu.Unlock()
		if during > n/4 {
			t.Fatalf("%d empty appends during %d acquires in a row, want them carried by the next append", during, n)
		}

		c.waitFor(time.Second, "every follower told of the last commit and applied it", func() bool {
			for i := range c.size() {
				if i != l && (told(i, commit).IsZero() || c.node(i).state.Applied() < commit) {
					return false
				}
			}
			return true
		})
		for i := range c.size() {
			if waited := told(i, commit).Sub(done); i != l && replicating[c.id(i)] && waited > 2*raftnode.CommitNoticeDelay {
				t.Fatalf("%s was told of the last commit %v after it, want within about %v", c.cfgs[i].Name, waited, raftnode.CommitNoticeDelay)
			}
		}
	})
}
