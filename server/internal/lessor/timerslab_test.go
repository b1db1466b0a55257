package lessor

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/leased/leased/fsm"
)

// TestTimerSlabReusesFreedSlotsAndVisitsTheLiveOnes: each visits exactly the timers in use, in slot
// order, across chunks; a freed slot is zeroed and handed out again before a new one; pointers handed
// out stay valid as the slab grows.
func TestTimerSlabReusesFreedSlotsAndVisitsTheLiveOnes(t *testing.T) {
	var s timerSlab
	const n = 2*slabChunk + 10
	timers := make([]*leaseTimer, n)
	for i := range timers {
		timers[i] = s.add(leaseTimer{token: uint64(i + 1), resource: "r"})
	}
	visit := func() []uint64 {
		var got []uint64
		s.each(func(t *leaseTimer) { got = append(got, t.token) })
		return got
	}
	if got := visit(); len(got) != n || !slices.IsSorted(got) || s.len() != n {
		t.Fatalf("visited %d timers (sorted %v), len %d; want all %d in slot order", len(got), slices.IsSorted(got), s.len(), n)
	}
	freed := []int{0, slabChunk - 1, slabChunk, n - 1}
	for _, i := range freed {
		s.remove(timers[i])
		if *timers[i] != (leaseTimer{}) {
			t.Fatalf("slot %d not zeroed on release: %+v", i, *timers[i])
		}
	}
	got := visit()
	if len(got) != n-len(freed) || s.len() != n-len(freed) {
		t.Fatalf("after freeing %d: visited %d, len %d", len(freed), len(got), s.len())
	}
	for _, i := range freed {
		if slices.Contains(got, uint64(i+1)) || s.get(uint64(i+1)) != nil {
			t.Fatalf("freed token %d still visited or found", i+1)
		}
	}
	for k := range freed {
		r := s.add(leaseTimer{token: uint64(1_000_000 + k)})
		if !slices.ContainsFunc(freed, func(i int) bool { return timers[i] == r }) {
			t.Fatal("a new slot was handed out while freed ones waited")
		}
	}
	if next := s.add(leaseTimer{token: 2_000_000}); slices.Contains(timers, next) {
		t.Fatal("with no slot free, add reused one in use")
	}
	for i, tm := range timers { // pointers from before the growth still name their slots
		if !slices.Contains(freed, i) && (tm.token != uint64(i+1) || s.get(uint64(i+1)) != tm) {
			t.Fatalf("timer %d reads token %d after the slab grew", i, tm.token)
		}
	}
}

// TestTimerSlabFindsEveryTimerByToken checks the token index against a map through random adds and
// removes that grow it past several doublings and shrink it back, over dense tokens (as log indexes are)
// and tokens chosen to share home buckets, whose removal must move the rest of their run back.
func TestTimerSlabFindsEveryTimerByToken(t *testing.T) {
	for _, tc := range []struct {
		name  string
		token func(i int) uint64
	}{
		{"dense", func(i int) uint64 { return uint64(i + 1) }},
		// Four tokens at a time whose products with the hash's multiplier differ in the low bits only:
		// they share a home bucket at every table size.
		{"colliding", func(i int) uint64 { return (uint64(i/4+1)*fibonacci + uint64(i%4)) * inverse(fibonacci) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			var s timerSlab
			want := map[uint64]*leaseTimer{}
			var live []uint64
			check := func(step int) {
				if s.len() != len(want) {
					t.Fatalf("step %d: len %d, want %d", step, s.len(), len(want))
				}
				for tok, tm := range want {
					if got := s.get(tok); got != tm || got.token != tok {
						t.Fatalf("step %d: token %d found %p, want %p", step, tok, got, tm)
					}
				}
				if s.get(tc.token(1<<21)) != nil || s.get(0) != nil {
					t.Fatalf("step %d: an absent token was found", step)
				}
				for i, tab := range s.index {
					if n := len(tab.buckets); tab.live*4 > n*3 || (n > minIndexBuckets && tab.live*8 < n/2) {
						t.Fatalf("step %d: table %d holds %d timers in %d buckets", step, i, tab.live, n)
					}
				}
			}
			next := 0
			for step := range 40_000 {
				grow := step < 20_000 && rng.IntN(4) != 0 || len(live) == 0
				if step >= 20_000 && rng.IntN(4) == 0 {
					grow = true
				}
				if grow {
					tok := tc.token(next)
					next++
					want[tok] = s.add(leaseTimer{token: tok})
					live = append(live, tok)
				} else {
					i := rng.IntN(len(live))
					tok := live[i]
					live[i] = live[len(live)-1]
					live = live[:len(live)-1]
					s.remove(want[tok])
					delete(want, tok)
				}
				if step%997 == 0 {
					check(step)
				}
			}
			check(40_000)
			if n := indexBuckets(&s); n >= 1<<13 {
				t.Fatalf("%d buckets left for %d timers: the index did not shrink", n, len(want))
			}
		})
	}
}

// TestLessorCompactsItsTimersAfterAMassRemoval: when most leases leave at once, the lessor moves the
// rest into a fresh slab — 20 chunks shrink below minSparseChunks — and every one of them is still found,
// queued in a valid heap, expired when due and renewed through a batch checked before the move.
func TestLessorCompactsItsTimersAfterAMassRemoval(t *testing.T) {
	const n, kept = 20 * slabChunk, 100
	out := make(chan Cmd, 1024)
	l := New(testConfig(), out)
	start := time.Now()
	l.Promote(start, 1)
	lease := func(i int) (string, uint64) { return fmt.Sprintf("r/%06d", i), uint64(i + 1) }
	for i := range n {
		res, tok := lease(i)
		l.add(start, fsm.Lease{Resource: res, Token: tok, TTLMs: 60_000})
	}
	keptRes, keptTok := lease(n - 1)
	batch := []Renewal{{Resource: keptRes, Token: keptTok}}
	gen, err := l.CheckRenewals(batch)
	if err != nil || batch[0].t == nil {
		t.Fatalf("check before the removal: %v, timer %v", err, batch[0].t)
	}
	l.mu.Lock()
	for i := range n - kept {
		l.remove(lease(i))
	}
	chunks, live := len(l.timers.chunks), l.timers.len()
	for i := n - kept; i < n; i++ {
		res, tok := lease(i)
		tm := l.current(res, tok)
		if tm == nil || !l.queued(tm) {
			t.Fatalf("lease %d after the compaction: timer %v, queued %v", i, tm, tm != nil && l.queued(tm))
		}
	}
	for i, q := range l.deadlines {
		if int(q.t.heapIdx) != i || (i > 0 && l.deadlines[(i-1)/2].at > q.at) {
			t.Fatalf("heap broken at %d after the compaction", i)
		}
	}
	l.mu.Unlock()
	if live != kept || chunks >= minSparseChunks { // a slab that small is not compacted again
		t.Fatalf("after removing %d of %d leases: %d live in %d chunks; want %d in fewer than %d", n-kept, n, live, chunks, kept, minSparseChunks)
	}
	at := start.Add(time.Second)
	if err := l.RenewChecked(gen, batch, at); err != nil || batch[0].Err != nil || batch[0].TTL != time.Minute {
		t.Fatalf("renewal checked before the compaction: %v, %v, ttl %v; want renewed", err, batch[0].Err, batch[0].TTL)
	}
	l.mu.Lock()
	renewedAt := l.current(keptRes, keptTok).renewedAt
	l.mu.Unlock()
	if renewedAt != l.at(at) {
		t.Fatal("the renewal did not reach the timer in the fresh slab")
	}
	for len(out) > 0 { // checkpoints and the like so far
		<-out
	}
	l.Tick(start.Add(60500 * time.Millisecond)) // all but the renewed lease (due at 61 s) are due
	expired := 0
	for len(out) > 0 {
		c := <-out
		for _, cmd := range c.Entries() {
			expired += len(cmd.GetExpire().GetLeases())
		}
	}
	if expired != kept-1 {
		t.Fatalf("%d leases proposed for expiry, want %d", expired, kept-1)
	}
}

func indexBuckets(s *timerSlab) int {
	n := 0
	for _, tab := range s.index {
		n += len(tab.buckets)
	}
	return n
}

// inverse returns the multiplicative inverse of odd x modulo 2^64 (Newton's iteration).
func inverse(x uint64) uint64 {
	y := x
	for range 6 {
		y *= 2 - x*y
	}
	return y
}

// TestTimerSlabCollidingTokensShareAHome: the colliding tokens above do share their table and home
// bucket, whatever the table's size (the hash's bits above the lowest eight).
func TestTimerSlabCollidingTokensShareAHome(t *testing.T) {
	for g := range 3 {
		tok := func(i int) uint64 { return (uint64(g+1)*fibonacci + uint64(i)) * inverse(fibonacci) }
		for i := 1; i < 4; i++ {
			if hashToken(tok(i))>>8 != hashToken(tok(0))>>8 {
				t.Fatalf("group %d: tokens %d and %d hash apart", g, tok(0), tok(i))
			}
		}
	}
}
