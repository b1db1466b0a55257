package fsm

import (
	"bytes"
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/leasepb"
)

func member(id uint64, name, peer, client string) *leasepb.Member {
	return &leasepb.Member{Id: id, Name: name, PeerAddr: peer, ClientAddr: client}
}

// applyMembers applies one conf change per call at successive indexes.
func applyMembers(t *testing.T, f *FSM, changes ...MemberChange) {
	t.Helper()
	for _, c := range changes {
		if err := f.ApplyMembers(f.AppliedIndex()+1, []MemberChange{c}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestMembersFollowConfChanges(t *testing.T) {
	f := New()
	applyMembers(t, f,
		MemberChange{MemberAddVoter, member(1, "n1", "p1", "")},
		MemberChange{MemberAddLearner, member(4, "n4", "p4", "c4")},
		// A promotion without metadata keeps the learner's addresses.
		MemberChange{MemberAddVoter, &leasepb.Member{Id: 4}},
		MemberChange{MemberUpdate, member(1, "n1", "p1", "c1")},
		// An update of an unknown member changes nothing (raft ignores it too).
		MemberChange{MemberUpdate, member(9, "n9", "p9", "c9")},
	)
	want := []*leasepb.Member{member(1, "n1", "p1", "c1"), member(4, "n4", "p4", "c4")}
	got := f.Members()
	if len(got) != len(want) {
		t.Fatalf("members %v, want %v", got, want)
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("member %d = %v, want %v", i, got[i], want[i])
		}
	}
	if f.MemberByName("n4").GetId() != 4 || f.Member(1).GetName() != "n1" {
		t.Errorf("lookups by name and id failed: %v %v", f.MemberByName("n4"), f.Member(1))
	}

	applyMembers(t, f, MemberChange{MemberRemove, &leasepb.Member{Id: 4}})
	if f.Member(4) != nil || !f.WasRemoved(4) {
		t.Fatalf("n4 not removed: %v removed=%v", f.Member(4), f.WasRemoved(4))
	}
	// A removed id never comes back.
	applyMembers(t, f, MemberChange{MemberAddLearner, member(4, "n4", "p4", "c4")})
	if f.Member(4) != nil {
		t.Fatalf("removed n4 was added again: %v", f.Member(4))
	}
	if f.AppliedIndex() != 7 {
		t.Errorf("applied %d, want 7", f.AppliedIndex())
	}
}

func TestMembersRoundTripThroughSnapshots(t *testing.T) {
	f := New()
	applyMembers(t, f,
		MemberChange{MemberAddVoter, member(3, "n3", "p3", "c3")},
		MemberChange{MemberAddVoter, member(1, "n1", "p1", "c1")},
		MemberChange{MemberAddLearner, member(2, "n2", "p2", "")},
		MemberChange{MemberAddVoter, member(7, "n7", "p7", "")},
		MemberChange{MemberRemove, &leasepb.Member{Id: 7}},
	)
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	g, err := Restore(snap)
	if err != nil {
		t.Fatal(err)
	}
	again, err := g.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(snap, again) {
		t.Fatal("restored member table snapshots to different bytes")
	}
	if !g.Member(2).GetIsLearner() || g.Member(1).GetIsLearner() || !g.WasRemoved(7) || len(g.Members()) != 3 {
		t.Errorf("restored table %v removed(7)=%v", g.Members(), g.WasRemoved(7))
	}
	if _, err := f.Snapshot(); err != nil {
		t.Fatal(err)
	}
	if err := f.ApplyMembers(f.AppliedIndex(), nil); !errors.Is(err, ErrIndexNotIncreasing) {
		t.Errorf("ApplyMembers at the applied index: %v, want ErrIndexNotIncreasing", err)
	}
}
