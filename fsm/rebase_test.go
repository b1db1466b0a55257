package fsm

import (
	"errors"
	"testing"
)

func TestRebaseMovesTheIndexAndGivesEveryLeaseAFullTTL(t *testing.T) {
	f := sampleState(t) // svc/leader checkpointed idle with 1234 ms left, applied 5, highest 3
	if err := f.Rebase(1 << 40); err != nil {
		t.Fatal(err)
	}
	g, err := Restore(mustSnapshot(t, f))
	if err != nil {
		t.Fatal(err)
	}
	if g.AppliedIndex() != 1<<40 || g.HighestToken() != 3 {
		t.Fatalf("rebased applied=%d highest=%d", g.AppliedIndex(), g.HighestToken())
	}
	l, ok := g.Get("svc/leader")
	if !ok || l.Token != 1 || string(l.Value) != "10.0.0.1:80" || l.RequestID != "q" {
		t.Fatalf("rebased lease = %+v %v", l, ok)
	}
	if l.Checkpointed || !l.Renewed || l.RemainingMs != 0 {
		t.Fatalf("rebased lease keeps its checkpoint: %+v", l)
	}
	if _, ok := g.LockDelayOf("cron/vacuum"); !ok {
		t.Fatal("rebase dropped a lock-delay")
	}
	// The next grant's token is its index: above the floor.
	res, err := g.Apply(1<<40+1, acq("new", "h", ""))
	if err != nil || res.Lease.Token != 1<<40+1 {
		t.Fatalf("grant after rebase = %+v, %v", res.Lease, err)
	}
}

func TestRebaseBelowTheAppliedIndexChangesNothing(t *testing.T) {
	f := sampleState(t)
	before := mustSnapshot(t, f)
	if err := f.Rebase(4); !errors.Is(err, ErrIndexNotIncreasing) {
		t.Fatalf("Rebase(4) at applied 5 = %v", err)
	}
	if string(mustSnapshot(t, f)) != string(before) {
		t.Fatal("a refused rebase changed the state")
	}
}
