package raftlog

import (
	"math/rand/v2"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// TestPageCheckAcceptsFilesAfterHeavyChurn guards the page check against
// false alarms: bbolt files shaped by many appends, overwrites, deletions,
// compactions, snapshots and large (overflow-page) entries must keep
// reopening. The oracle test's logs are too small to need branch pages.
func TestPageCheckAcceptsFilesAfterHeavyChurn(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 3))
	dir := t.TempDir()
	s := mustOpen(t, dir)
	rounds := 1000
	if testing.Short() {
		rounds = 100
	}
	for round := range rounds {
		last, _ := s.LastIndex()
		first, _ := s.FirstIndex()
		start := last + 1 - min(uint64(rng.IntN(20)), last+1-first)
		ents := make([]*raftpb.Entry, 1+rng.IntN(200))
		for k := range ents {
			size := rng.IntN(300)
			if rng.IntN(50) == 0 {
				size = 4096 + rng.IntN(12000)
			}
			ents[k] = &raftpb.Entry{Index: new(start + uint64(k)), Term: new(uint64(round)), Data: make([]byte, size)}
		}
		if err := s.Save(hardState(uint64(round), 1, start), ents, nil); err != nil {
			t.Fatal(err)
		}
		last, _ = s.LastIndex()
		switch rng.IntN(10) {
		case 0:
			if err := s.Compact(first + (last-first)/2); err != nil {
				t.Fatal(err)
			}
		case 1:
			// A truncating Save may have moved last below the snapshot.
			if _, err := s.CreateSnapshot(last, nil, make([]byte, rng.IntN(20000))); err != nil && err != raft.ErrSnapOutOfDate {
				t.Fatal(err)
			}
		case 2:
			cur, _ := s.Snapshot()
			at := max(last, cur.GetMetadata().GetIndex()) + 10
			snap := &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(at), Term: new(uint64(round))}}
			if err := s.Save(nil, entries(at+1, at+20, uint64(round)), snap); err != nil {
				t.Fatal(err)
			}
		case 3:
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = mustOpen(t, dir)
		}
	}
}
