package fsm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
)

func TestReleaseAnswersWhatHappenedToTheToken(t *testing.T) {
	a := newApplier(t)
	a.apply(acq("r", "h1", "")) // 1
	a.apply(acq("e", "h1", "")) // 2
	a.apply(rel("r", 1))        // 3: released
	a.apply(expire("e", 2))     // 4: expired
	a.apply(acq("r", "h2", "")) // 5: r granted again
	a.apply(acq("x", "h2", "")) // 6
	tests := []struct {
		name     string
		cmd      *wirepb.Command
		code     Code
		replayed bool
		end      End
	}{
		{"retry of a release that took effect", rel("r", 1), OK, true, End{Resource: "r", Token: 1, How: EndReleased, Index: 3}},
		{"release after expiry", rel("e", 2), NotCurrent, false, End{Resource: "e", Token: 2, How: EndExpired, Index: 4}},
		{"released token, other resource", rel("x", 1), NotCurrent, false, End{Resource: "x", Token: 1, How: EndNone}},
		{"never a grant", rel("r", 4), NotCurrent, false, End{Resource: "r", Token: 4, How: EndNone}},
		{"beyond every grant", rel("r", 99), NotCurrent, false, End{Resource: "r", Token: 99, How: EndNone}},
		{"token zero", rel("r", 0), NotCurrent, false, End{Resource: "r", Token: 0, How: EndNone}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := mustSnapshot(t, a.f)
			res := a.apply(tt.cmd)
			if res.Code != tt.code || res.Replayed != tt.replayed || res.End != tt.end || len(res.Events) != 0 {
				t.Fatalf("got %v replayed=%v end=%+v events=%v; want %v replayed=%v end=%+v, no events",
					res.Code, res.Replayed, res.End, res.Events, tt.code, tt.replayed, tt.end)
			}
			if !bytes.Equal(stateOf(t, a.f), stateOf(t, mustRestore(t, before))) {
				t.Fatal("a release of a token that is not current changed the state")
			}
		})
	}
	if l, ok := a.f.Get("r"); !ok || l.Token != 5 {
		t.Fatalf("the retried release touched the new grant of r: %+v %v", l, ok)
	}
	if got := a.f.EndOf("r", 5); got.How != EndNone {
		t.Fatalf("EndOf a current token = %+v, want EndNone", got)
	}
}

// stateOf is the snapshot with the applied index zeroed, to compare states at different indexes.
func stateOf(t *testing.T, f *FSM) []byte {
	t.Helper()
	body := new(wirepb.SnapshotBody)
	if err := proto.Unmarshal(mustSnapshot(t, f)[headerSize:], body); err != nil {
		t.Fatal(err)
	}
	body.AppliedIndex = 0
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(body)
	return b
}

func mustRestore(t *testing.T, snap []byte) *FSM {
	t.Helper()
	f, err := Restore(snap)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestRememberedEndsAreBoundedOldestFirst(t *testing.T) {
	a := newApplier(t)
	const extra = 10
	var tokens []uint64
	for i := range MaxRememberedEnds + extra {
		r := fmt.Sprintf("r%d", i%100)
		tok := a.apply(acq(r, "h", "")).Lease.Token
		a.apply(rel(r, tok))
		tokens = append(tokens, tok)
	}
	if n := a.f.RememberedEnds(); n != MaxRememberedEnds {
		t.Fatalf("remembers %d ends, want the bound %d", n, MaxRememberedEnds)
	}
	for i, tok := range tokens {
		r := fmt.Sprintf("r%d", i%100)
		got := a.f.EndOf(r, tok)
		want := EndReleased
		if i < extra {
			want = EndForgotten
		}
		if got.How != want {
			t.Fatalf("end %d (token %d) = %v, want %v", i, tok, got.How, want)
		}
	}
	// An evicted release is no longer known: a retry gets NotCurrent, saying it is forgotten.
	if res := a.apply(rel("r0", tokens[0])); res.Code != NotCurrent || res.End.How != EndForgotten {
		t.Fatalf("release of an evicted end = %v %+v, want NotCurrent, forgotten", res.Code, res.End)
	}
	// The bound holds across a snapshot, and the restored FSM evicts the same way.
	g := mustRestore(t, mustSnapshot(t, a.f))
	if !bytes.Equal(mustSnapshot(t, g), mustSnapshot(t, a.f)) || g.RememberedEnds() != MaxRememberedEnds {
		t.Fatal("restore changed the remembered ends")
	}
	tok := a.apply(acq("z", "h", "")).Lease.Token
	if _, err := g.Apply(tok, acq("z", "h", "")); err != nil {
		t.Fatal(err)
	}
	a.apply(rel("z", tok))
	if _, err := g.Apply(tok+1, rel("z", tok)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(mustSnapshot(t, g), mustSnapshot(t, a.f)) {
		t.Fatal("restored and straight FSMs diverged after an eviction")
	}
	if g.EndOf("r0", tokens[extra]).How != EndForgotten || g.EndOf("z", tok).How != EndReleased {
		t.Fatal("the restored FSM did not evict the oldest end")
	}
}

func TestExpiryEndsOfOneEntryEvictedPartlyStillRestore(t *testing.T) {
	a := newApplier(t)
	var refs []*leasepb.LeaseRef
	for i := range MaxRememberedEnds + 5 {
		r := fmt.Sprintf("r%06d", i)
		refs = append(refs, &leasepb.LeaseRef{Resource: r, Token: a.apply(acq(r, "h", "")).Lease.Token})
	}
	// One entry ends them all: the first five of its ends are evicted by the last five.
	idx := a.next
	res := a.apply(&wirepb.Command{Op: &wirepb.Command_Expire{Expire: &wirepb.ExpireCmd{Leases: refs}}})
	if len(res.Events) != len(refs) {
		t.Fatalf("expired %d of %d", len(res.Events), len(refs))
	}
	g := mustRestore(t, mustSnapshot(t, a.f))
	for _, f := range []*FSM{a.f, g} {
		if e := f.EndOf(refs[4].Resource, refs[4].Token); e.How != EndForgotten {
			t.Fatalf("evicted end = %+v", e)
		}
		if e := f.EndOf(refs[5].Resource, refs[5].Token); e.How != EndExpired || e.Index != idx {
			t.Fatalf("kept end of the same entry = %+v, want expired at %d", e, idx)
		}
	}
}

func TestSnapshotCarriesRememberedEnds(t *testing.T) {
	a := newApplier(t)
	a.apply(acq("r", "h", "")) // 1
	a.apply(acq("e", "h", "")) // 2
	a.apply(rel("r", 1))       // 3
	a.apply(expire("e", 2))    // 4
	g := mustRestore(t, mustSnapshot(t, a.f))
	if e := g.EndOf("r", 1); e != (End{Resource: "r", Token: 1, How: EndReleased, Index: 3}) {
		t.Fatalf("restored release end = %+v", e)
	}
	if e := g.EndOf("e", 2); e != (End{Resource: "e", Token: 2, How: EndExpired, Index: 4}) {
		t.Fatalf("restored expiry end = %+v", e)
	}
	if res, _ := g.Apply(5, rel("r", 1)); res.Code != OK || !res.Replayed {
		t.Fatalf("a retried release after a restore = %v replayed=%v, want OK replayed", res.Code, res.Replayed)
	}
}

func sealed(t *testing.T, body *wirepb.SnapshotBody) []byte {
	t.Helper()
	payload, err := proto.MarshalOptions{Deterministic: true}.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	return envelope(payload)
}

// envelope wraps a snapshot body in its header.
func envelope(payload []byte) []byte {
	out := make([]byte, headerSize, headerSize+len(payload))
	copy(out, snapshotMagic)
	binary.BigEndian.PutUint32(out[8:], snapshotVersion)
	binary.BigEndian.PutUint64(out[12:], uint64(len(payload)))
	binary.BigEndian.PutUint32(out[20:], crc32.Checksum(payload, castagnoli))
	return append(out, payload...)
}

func TestRestoreRejectsInconsistentEnds(t *testing.T) {
	lease := []*wirepb.LeaseRecord{{Resource: "a", Holder: "h", Token: 5, TtlMs: 1}}
	rel := leasepb.EventType_EVENT_TYPE_RELEASED
	tests := map[string]*wirepb.SnapshotBody{
		"no forgotten_through":             {AppliedIndex: 9, HighestToken: 5},
		"forgotten_through beyond applied": {AppliedIndex: 9, HighestToken: 5, ForgottenThrough: proto.Uint64(10)},
		"unknown kind": {AppliedIndex: 9, HighestToken: 5, ForgottenThrough: proto.Uint64(0),
			Ends: []*wirepb.LeaseEndRecord{{Resource: "b", Token: 1, Index: 2}}},
		"end before its grant": {AppliedIndex: 9, HighestToken: 5, ForgottenThrough: proto.Uint64(0),
			Ends: []*wirepb.LeaseEndRecord{{Resource: "b", Token: 3, Index: 2, How: rel}}},
		"token above highest": {AppliedIndex: 9, HighestToken: 5, ForgottenThrough: proto.Uint64(0),
			Ends: []*wirepb.LeaseEndRecord{{Resource: "b", Token: 6, Index: 7, How: rel}}},
		"out of order": {AppliedIndex: 9, HighestToken: 5, ForgottenThrough: proto.Uint64(0),
			Ends: []*wirepb.LeaseEndRecord{{Resource: "b", Token: 1, Index: 4, How: rel}, {Resource: "c", Token: 2, Index: 3, How: rel}}},
		"below forgotten_through": {AppliedIndex: 9, HighestToken: 5, ForgottenThrough: proto.Uint64(4),
			Ends: []*wirepb.LeaseEndRecord{{Resource: "b", Token: 1, Index: 3, How: rel}}},
		"ended twice": {AppliedIndex: 9, HighestToken: 5, ForgottenThrough: proto.Uint64(0),
			Ends: []*wirepb.LeaseEndRecord{{Resource: "b", Token: 1, Index: 3, How: rel}, {Resource: "b", Token: 1, Index: 4, How: rel}}},
		"current and ended": {AppliedIndex: 9, HighestToken: 5, ForgottenThrough: proto.Uint64(0), Leases: lease,
			Ends: []*wirepb.LeaseEndRecord{{Resource: "a", Token: 5, Index: 6, How: rel}}},
	}
	for name, body := range tests {
		t.Run(name, func(t *testing.T) {
			f, err := Restore(sealed(t, body))
			if !errors.Is(err, ErrBadSnapshot) || f != nil {
				t.Fatalf("Restore = %v, %v; want ErrBadSnapshot", f, err)
			}
		})
	}
}
