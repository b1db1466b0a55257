package raftnode

import (
	"testing"

	"go.etcd.io/raft/v3/raftpb"
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
