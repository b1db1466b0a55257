package fsm

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/leased/leased/api/wirepb"
)

// proclaim replaces the value of (resource, token).
func proclaim(resource string, token uint64, value string) *wirepb.Command {
	return &wirepb.Command{Op: &wirepb.Command_Proclaim{Proclaim: &wirepb.ProclaimCmd{Resource: resource, Token: token, Value: []byte(value)}}}
}

// TestPropertyViewsStayFrozen: views taken at random points of a random log, and not released, still
// encode, at the end, to the bytes they encoded to when taken, whatever the FSM applied since
// (checkpoints, renewal marks and proclaims of the leases they share included, some of them changed in
// place while every view was released); and taking and releasing views changes nothing the FSM does: its
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
			if len(views) > 0 && rapid.IntRange(0, 5).Draw(rt, "release") == 0 {
				i := rapid.IntRange(0, len(views)-1).Draw(rt, "released")
				views[i].v.Release()
				if _, err := views[i].v.Encode(); !errors.Is(err, ErrViewReleased) {
					rt.Fatalf("a released view encoded: %v", err)
				}
				views = slices.Delete(views, i, i+1)
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

// TestReleasedViewsLetLeasesChangeInPlace: while any view is live, a checkpoint copies a lease older
// than the latest view (the view keeps the old one), and changes a lease made since in place; once every
// view is released it changes even an old lease in place; and a released view refuses to encode.
func TestReleasedViewsLetLeasesChangeInPlace(t *testing.T) {
	a := newApplier(t)
	a.apply(acq("r", "h", "q1"))
	held := func() *lease {
		l, ok := a.f.lookup("r")
		if !ok {
			t.Fatal("the lease is gone")
		}
		return l
	}
	cp := func(ms int64) { a.apply(checkpoint(&wirepb.LeaseCheckpoint{Resource: "r", Token: 1, RemainingMs: ms})) }

	first, second := a.f.View(), a.f.View()
	first.Release()
	before := held()
	cp(5)
	if held() == before {
		t.Fatal("a lease a live view shares was changed in place")
	}
	copied := held()
	cp(6)
	if held() != copied {
		t.Fatal("a lease copied after the latest view was copied again")
	}
	second.Release()
	second.Release() // a second call does nothing
	a.f.View().Release()
	old := held()
	cp(7)
	if held() != old {
		t.Fatal("a checkpoint copied the lease although every view was released")
	}
	if got := held().remainingMs; got != 7 {
		t.Fatalf("remaining %d ms after the checkpoint, want 7", got)
	}
	if _, err := second.Encode(); !errors.Is(err, ErrViewReleased) {
		t.Fatalf("encoding a released view: %v, want ErrViewReleased", err)
	}
	if n := a.f.liveViews.Load(); n != 0 {
		t.Fatalf("%d live views counted after every one was released", n)
	}
}
