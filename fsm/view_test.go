package fsm

import (
	"bytes"
	"fmt"
	"reflect"
	"testing"

	"pgregory.net/rapid"

	"github.com/leased/leased/api/wirepb"
)

// proclaim replaces the value of (resource, token).
func proclaim(resource string, token uint64, value string) *wirepb.Command {
	return &wirepb.Command{Op: &wirepb.Command_Proclaim{Proclaim: &wirepb.ProclaimCmd{Resource: resource, Token: token, Value: []byte(value)}}}
}

// TestPropertyViewsStayFrozen: views taken at random points of a random log still encode, at the end,
// to the bytes they encoded to when taken, whatever the FSM applied since (checkpoints, renewal marks and
// proclaims of the leases they share included); and taking views changes nothing the FSM does: its
// results and its final snapshot equal those of a twin that applied the same log without views.
func TestPropertyViewsStayFrozen(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		withViews, twin := New(), New()
		type taken struct {
			v    *View
			want []byte
		}
		var views []taken
		n := rapid.IntRange(1, 120).Draw(rt, "n")
		for i := uint64(1); i <= uint64(n); i++ {
			cmd := genCommand(i).Draw(rt, "cmd")
			if rapid.IntRange(0, 9).Draw(rt, "proclaim") == 0 {
				cmd = proclaim(rapid.SampledFrom([]string{"a", "b", "c"}).Draw(rt, "resource"),
					rapid.Uint64Range(1, i).Draw(rt, "token"), fmt.Sprint("v", i))
			}
			got, err1 := withViews.Apply(i, cmd)
			want, err2 := twin.Apply(i, cmd)
			if err1 != nil || err2 != nil {
				rt.Fatalf("apply %d: %v / %v", i, err1, err2)
			}
			if !reflect.DeepEqual(got, want) {
				rt.Fatalf("entry %d: with views %v, without %v", i, got, want)
			}
			if rapid.IntRange(0, 4).Draw(rt, "view") == 0 {
				v := withViews.View()
				b, err := v.Encode()
				if err != nil {
					rt.Fatal(err)
				}
				views = append(views, taken{v, b})
			}
		}
		for i, tk := range views {
			b, err := tk.v.Encode()
			if err != nil {
				rt.Fatal(err)
			}
			if !bytes.Equal(b, tk.want) {
				rt.Fatalf("view %d (index %d) changed after it was taken", i, tk.v.AppliedIndex())
			}
		}
		if a, b := mustSnapshot(t, withViews), mustSnapshot(t, twin); !bytes.Equal(a, b) {
			rt.Fatalf("final snapshots differ with and without views")
		}
	})
}

// TestViewEncodesWhileTheFSMApplies encodes a view on another goroutine while the FSM changes every
// lease the view shares (run with -race: a lease changed in place is a data race), then checks the view
// encoded the state it was taken at.
func TestViewEncodesWhileTheFSMApplies(t *testing.T) {
	a := newApplier(t)
	const leases = 2000
	for i := range leases {
		a.apply(acq(fmt.Sprintf("r/%04d", i), "h", fmt.Sprint("q", i)))
	}
	want := mustSnapshot(t, a.f)
	v := a.f.View()
	done := make(chan []byte)
	go func() {
		b, err := v.Encode()
		if err != nil {
			t.Error(err)
		}
		done <- b
	}()
	for i := range leases {
		r, tok := fmt.Sprintf("r/%04d", i), uint64(i+1)
		switch i % 3 {
		case 0:
			a.apply(checkpoint(&wirepb.LeaseCheckpoint{Resource: r, Token: tok, RemainingMs: 5}))
		case 1:
			a.apply(proclaim(r, tok, "changed"))
		default:
			a.apply(rel(r, tok))
		}
	}
	got := <-done
	if !bytes.Equal(got, want) {
		t.Fatal("the view did not encode the state it was taken at")
	}
	if bytes.Equal(mustSnapshot(t, a.f), want) {
		t.Fatal("the FSM did not change")
	}
}
