package server

import (
	"fmt"
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
		timers[i] = s.alloc()
		timers[i].token, timers[i].resource = uint64(i+1), "r"
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
		s.release(timers[i])
		if *timers[i] != (leaseTimer{}) {
			t.Fatalf("slot %d not zeroed on release: %+v", i, *timers[i])
		}
	}
	got := visit()
	if len(got) != n-len(freed) || s.len() != n-len(freed) {
		t.Fatalf("after freeing %d: visited %d, len %d", len(freed), len(got), s.len())
	}
	for _, i := range freed {
		if slices.Contains(got, uint64(i+1)) {
			t.Fatalf("freed token %d still visited", i+1)
		}
	}
	for range freed {
		r := s.alloc()
		if !slices.ContainsFunc(freed, func(i int) bool { return timers[i] == r }) {
			t.Fatal("a new slot was handed out while freed ones waited")
		}
		r.token = 1_000_000
	}
	if next := s.alloc(); slices.Contains(timers, next) {
		t.Fatal("with no slot free, alloc reused one in use")
	}
	for i, tm := range timers { // pointers from before the growth still name their slots
		if !slices.Contains(freed, i) && tm.token != uint64(i+1) {
			t.Fatalf("timer %d reads token %d after the slab grew", i, tm.token)
		}
	}
}

// TestLessorCompactsItsTimersAfterAMassRemoval: when most leases leave at once, the lessor moves the
// rest into a fresh slab — 20 chunks shrink below minSparseChunks — and every one of them is still found,
// queued in a valid heap, expired when due and renewed through a batch checked before the move.
func TestLessorCompactsItsTimersAfterAMassRemoval(t *testing.T) {
	const n, kept = 20 * slabChunk, 100
	out := make(chan lessorCmd, 1024)
	l := newLessor(TestConfig(), out)
	start := time.Now()
	l.promote(start, 1)
	lease := func(i int) (string, uint64) { return fmt.Sprintf("r/%06d", i), uint64(i + 1) }
	for i := range n {
		res, tok := lease(i)
		l.add(start, fsm.Lease{Resource: res, Token: tok, TTLMs: 60_000})
	}
	keptRes, keptTok := lease(n - 1)
	batch := []renewalCheck{{resource: keptRes, token: keptTok}}
	gen, err := l.checkRenewals(batch)
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
	if err := l.renewChecked(gen, batch, at); err != nil || batch[0].err != nil || batch[0].ttl != time.Minute {
		t.Fatalf("renewal checked before the compaction: %v, %v, ttl %v; want renewed", err, batch[0].err, batch[0].ttl)
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
	l.tick(start.Add(60500 * time.Millisecond)) // all but the renewed lease (due at 61 s) are due
	expired := 0
	for len(out) > 0 {
		c := <-out
		for _, cmd := range c.entries() {
			expired += len(cmd.GetExpire().GetLeases())
		}
	}
	if expired != kept-1 {
		t.Fatalf("%d leases proposed for expiry, want %d", expired, kept-1)
	}
}
