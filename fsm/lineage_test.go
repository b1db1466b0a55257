package fsm

import "testing"

// The cluster id and generation travel in snapshots; each Rebase (a restore) adds one generation.
func TestLineageTravelsInSnapshots(t *testing.T) {
	f := sampleState(t)
	if f.ClusterID() != 0 || f.Generation() != 0 {
		t.Fatalf("a new state: cluster %x generation %d", f.ClusterID(), f.Generation())
	}
	f.SetClusterID(0xabc)
	g, err := Restore(mustSnapshot(t, f))
	if err != nil {
		t.Fatal(err)
	}
	if g.ClusterID() != 0xabc || g.Generation() != 0 {
		t.Fatalf("restored: cluster %x generation %d, want abc and 0", g.ClusterID(), g.Generation())
	}
	for gen := uint64(1); gen <= 2; gen++ {
		if err := g.Rebase(g.AppliedIndex()+1<<40, nil); err != nil {
			t.Fatal(err)
		}
		g.SetClusterID(0xdef + gen)
		if g, err = Restore(mustSnapshot(t, g)); err != nil {
			t.Fatal(err)
		}
		if g.ClusterID() != 0xdef+gen || g.Generation() != gen {
			t.Fatalf("after %d rebases: cluster %x generation %d", gen, g.ClusterID(), g.Generation())
		}
	}
	// A refused rebase leaves the generation as it was.
	if err := g.Rebase(1, nil); err == nil || g.Generation() != 2 {
		t.Fatalf("Rebase below the index: %v, generation %d", err, g.Generation())
	}
}
