package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/leased/leased/api/leasepb"
)

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
			next[i] = c.node(i).raft.NextSnapshotAt(md.GetIndex(), md.GetConfState())
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
