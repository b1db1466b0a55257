package fsm

import (
	"reflect"
	"strconv"
	"testing"

	"pgregory.net/rapid"
)

// TestRequestIndexCollisionsChangeNothing applies the same random commands to a state machine whose
// request index hashes every key alike (each key after the first goes to the overflow map) and to a
// normal one: every result must be the same, so collisions cannot make nodes disagree.
func TestRequestIndexCollisionsChangeNothing(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		normal, colliding := New(), New()
		colliding.byRequest.hash = func(requestKey) uint64 { return 7 }
		for i := uint64(1); i <= 60; i++ {
			cmd := genCommand(i).Draw(t, "cmd")
			want, err1 := normal.Apply(i, cmd)
			got, err2 := colliding.Apply(i, cmd)
			if !reflect.DeepEqual(want, got) || (err1 == nil) != (err2 == nil) {
				t.Fatalf("entry %d (%v): colliding index answered %+v (%v), normal %+v (%v)", i, cmd, got, err2, want, err1)
			}
		}
	})
}

// TestRequestIndexFindsEveryKey checks the index against a map through adds, replaces and removes that
// grow its tables past several doublings and shrink them back: with the real hash, where every lease
// finds a bucket, and with one that sends every key home to the same bucket, where all but maxProbe of
// them must go to the overflow map and still be found, replaced and removed.
func TestRequestIndexFindsEveryKey(t *testing.T) {
	for _, tc := range []struct {
		name string
		hash func(requestKey) uint64
		n    int
	}{
		{"fnv", fnvHash, 30_000},
		{"colliding", func(requestKey) uint64 { return 7 }, 300},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := newRequestIndex()
			x.hash = tc.hash
			want := map[requestKey]*lease{}
			holders := []*holder{newHolder("a"), newHolder("b")}
			mk := func(i int) *lease {
				l := &lease{holder: holders[i%2], requestID: strconv.Itoa(i)}
				if i%3 == 0 {
					l.identity = "id" + strconv.Itoa(i%7)
				}
				return l
			}
			check := func(stage string) {
				for k, l := range want {
					if got, ok := x.get(k); !ok || got != l {
						t.Fatalf("%s: key %v found %p (%v), want %p", stage, k, got, ok, l)
					}
				}
				if _, ok := x.get(requestKey{holder: "a", id: "absent"}); ok {
					t.Fatalf("%s: an absent key was found", stage)
				}
				live := len(x.overflow)
				for i := range x.tables {
					live += x.tables[i].live
				}
				if live != len(want) {
					t.Fatalf("%s: the index holds %d leases, want %d", stage, live, len(want))
				}
			}
			for i := range tc.n {
				l := mk(i)
				x.add(keyOf(l), l)
				want[keyOf(l)] = l
			}
			check("after the adds")
			if tc.name == "colliding" && len(x.overflow) != tc.n-maxProbe {
				t.Fatalf("%d keys in the overflow map, want all but the %d that fit", len(x.overflow), maxProbe)
			} else if tc.name == "fnv" && len(x.overflow) != 0 {
				t.Fatalf("%d keys in the overflow map with the real hash", len(x.overflow))
			}
			dup := mk(1) // the same key as lease 1: the first keeps it
			x.add(keyOf(dup), dup)
			check("after a second lease under a taken key")
			i := 0
			for k, l := range want {
				switch i % 3 {
				case 0:
					x.remove(k, l)
					delete(want, k)
				case 1:
					c := *l
					x.replace(k, l, &c)
					want[k] = &c
				}
				i++
			}
			check("after removing and replacing a third each")
			for k, l := range want {
				x.remove(k, l)
				delete(want, k)
			}
			check("after removing all")
			for i := range x.tables {
				if n := len(x.tables[i].buckets); n > 2*minBuckets {
					t.Fatalf("table %d keeps %d buckets with no lease", i, n)
				}
			}
		})
	}
}

// TestRestoredIndexAnswersEveryRetry restores a state in which some leases carry request ids (the index
// is built at the end of the restore, presized): every retry of a live grant is a replay, a new id is
// a new grant, and a lease without an id is in no index.
func TestRestoredIndexAnswersEveryRetry(t *testing.T) {
	const n = 6_000
	cmds := distinctAcquires(n, true)
	for i, c := range cmds {
		if i%4 == 0 {
			c.GetAcquire().RequestId = ""
		}
	}
	before := New()
	for i, c := range cmds {
		if res, err := before.Apply(uint64(i+1), c); err != nil || res.Code != OK {
			t.Fatalf("grant %d: %v %v", i, res.Code, err)
		}
	}
	after := mustRestore(t, mustSnapshot(t, before))
	for i, c := range cmds {
		res, err := after.Apply(uint64(n+1+i), c)
		if err != nil {
			t.Fatal(err)
		}
		if want := i%4 != 0; res.Replayed != want {
			t.Fatalf("retry of grant %d (request id %q): replayed %v, want %v", i, c.GetAcquire().GetRequestId(), res.Replayed, want)
		}
	}
	if got, want := indexed(&after.byRequest), n-n/4; got != want {
		t.Fatalf("restored index holds %d keys, want %d", got, want)
	}
}

// TestReserveLeavesNoResize checks that a table reserved for n keys takes its share of them without a
// resize: the point of reserving.
func TestReserveLeavesNoResize(t *testing.T) {
	for _, n := range []int{1, 1_000, 100_000} {
		x := newRequestIndex()
		x.reserve(n)
		var sizes [requestTables]int
		for i := range x.tables {
			sizes[i] = len(x.tables[i].buckets)
		}
		h := newHolder("h")
		for i := range n {
			x.add(requestKey{holder: "h", id: strconv.Itoa(i)}, &lease{holder: h, requestID: strconv.Itoa(i)})
		}
		for i := range x.tables {
			if got := len(x.tables[i].buckets); got != sizes[i] {
				t.Fatalf("n=%d: table %d resized from %d to %d buckets (%d keys)", n, i, sizes[i], got, x.tables[i].live)
			}
		}
	}
}

// indexed counts the keys in x.
func indexed(x *requestIndex) int {
	n := len(x.overflow)
	for i := range x.tables {
		n += x.tables[i].live
	}
	return n
}
