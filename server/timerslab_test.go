package server

import (
	"slices"
	"testing"
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
