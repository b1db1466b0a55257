package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/leased/leased/api/leasepb"
)

func TestNextSnapshotAtKeepsTheNodesPhase(t *testing.T) {
	cases := []struct {
		snapIndex, entries, phase, want uint64
	}{
		{0, 100, 0, 100},    // a fresh node at phase 0: as without phases
		{0, 100, 33, 133},   // 33 is less than half an interval past 0: the next point at the phase
		{0, 100, 66, 66},    // 66 is at least half an interval past 0
		{133, 100, 33, 233}, // at its phase: every interval from then on
		{100, 100, 33, 233}, // a snapshot from a leader at another phase: 1.33 intervals later
		{170, 100, 33, 233}, // ... or 0.63
		{5, 1, 0, 6},        // an interval of one entry
		{7, 20, 45, 25},     // a phase past the interval wraps
	}
	for _, c := range cases {
		if got := nextSnapshotAt(c.snapIndex, c.entries, c.phase); got != c.want {
			t.Errorf("nextSnapshotAt(%d, %d, %d) = %d, want %d", c.snapIndex, c.entries, c.phase, got, c.want)
		}
	}
}

func TestSnapshotPhaseSpreadsTheVoters(t *testing.T) {
	cs := &raftpb.ConfState{Voters: []uint64{30, 10, 20}, Learners: []uint64{40}}
	for id, want := range map[uint64]uint64{10: 0, 20: 33, 30: 66, 40: 0, 50: 0} {
		if got := snapshotPhase(id, cs, 100); got != want {
			t.Errorf("snapshotPhase(%d) = %d, want %d", id, got, want)
		}
	}
	if got := snapshotPhase(7, &raftpb.ConfState{Voters: []uint64{7}}, 100); got != 0 {
		t.Errorf("a lone node's phase is %d, want 0", got)
	}
}

// TestSimVotersSnapshotAtDifferentIndexes: three nodes applying the same log take their snapshots a
// third of an interval apart, so that no index finds every member busy with one. What is checked is each
// node's next snapshot point, from the snapshot it took last (a follower that lags applies in bursts and
// may snapshot past its point, then returns to it): without the phases all three points coincide.
func TestSimVotersSnapshotAtDifferentIndexes(t *testing.T) {
	const entries = 300
	runSim(t, 3, func(cfg *Config) { cfg.SnapshotEntries, cfg.SnapshotCatchUp = entries, 3*entries }, func(t *testing.T, c *simCluster) {
		ctx := context.Background()
		l := c.waitLeader(10 * time.Second)
		for k := range 3 * entries {
			r := fmt.Sprintf("r/%d", k)
			if _, err := c.acquire(ctx, func(int) int { return l }, &leasepb.AcquireRequest{Resource: r, Holder: "h", TtlMs: 600_000, RequestId: r}); err != nil {
				t.Fatal(err)
			}
		}
		c.converge(20 * time.Second)
		next := make([]uint64, c.size())
		for i := range next {
			snap, err := c.logs[i].Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			md := snap.GetMetadata()
			if md.GetIndex() == 0 {
				t.Fatalf("n%d took no snapshot in %d entries", i+1, 3*entries)
			}
			next[i] = nextSnapshotAt(md.GetIndex(), entries, snapshotPhase(c.node(i).id, md.GetConfState(), entries))
		}
		for i := range next {
			for j := range i {
				if d := (next[i] - next[j] + 3*entries) % entries; min(d, entries-d) < entries/6 {
					t.Errorf("n%d and n%d take their next snapshots at %d and %d: %d entries apart in the interval, want about %d", j+1, i+1, next[j], next[i], min(d, entries-d), entries/3)
				}
			}
		}
	})
}
