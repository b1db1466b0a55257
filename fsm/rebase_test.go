package fsm

import (
	"errors"
	"testing"

	"github.com/leased/leased/api/leasepb"
)

func TestRebaseMovesTheIndexAndGivesEveryLeaseAFullTTL(t *testing.T) {
	f := sampleState(t) // svc/leader checkpointed idle with 1234 ms left, applied 5, highest 3
	if err := f.Rebase(1<<40, nil); err != nil {
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
	if err := f.Rebase(4, []*leasepb.Member{{Id: 9, Name: "x", PeerAddr: "h:1"}}); !errors.Is(err, ErrIndexNotIncreasing) {
		t.Fatalf("Rebase(4) at applied 5 = %v", err)
	}
	if string(mustSnapshot(t, f)) != string(before) {
		t.Fatal("a refused rebase changed the state")
	}
}

// The restored state's member table is the new cluster's: the old members, their addresses and removed
// ids belong to the cluster the backup came from.
func TestRebaseReplacesTheMemberTable(t *testing.T) {
	f := New()
	if err := f.ApplyMembers(1, []MemberChange{
		{Kind: MemberAddVoter, Member: &leasepb.Member{Id: 1, Name: "old1", PeerAddr: "old:1"}},
		{Kind: MemberAddVoter, Member: &leasepb.Member{Id: 2, Name: "old2", PeerAddr: "old:2"}},
	}); err != nil {
		t.Fatal(err)
	}
	if err := f.ApplyMembers(2, []MemberChange{{Kind: MemberRemove, Member: &leasepb.Member{Id: 2}}}); err != nil {
		t.Fatal(err)
	}
	if err := f.Rebase(100, []*leasepb.Member{{Id: 7, Name: "n1", PeerAddr: "new:1"}, {Id: 8, Name: "n2", PeerAddr: "new:2"}}); err != nil {
		t.Fatal(err)
	}
	g, err := Restore(mustSnapshot(t, f))
	if err != nil {
		t.Fatal(err)
	}
	ms := g.Members()
	if len(ms) != 2 || ms[0].GetName() != "n1" || ms[1].GetPeerAddr() != "new:2" || g.Member(1) != nil || g.WasRemoved(2) {
		t.Fatalf("members after rebase: %v (old 1: %v, 2 removed: %v)", ms, g.Member(1), g.WasRemoved(2))
	}
}
