package lessor

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/fsm"
)

// BenchmarkCheckpointScan: one checkpoint scan of a leader holding a million leases, none of them due
// (all renewed a second ago): the time the Ready loop and the lessor's lock are held every scan period
// (a quarter of --checkpoint-interval), whatever the leases do.
// Run: go test -run '^$' -bench CheckpointScan -benchtime 10x ./server/internal/lessor/
func BenchmarkCheckpointScan(b *testing.B) {
	const n = 1_000_000
	l := New(defaultConfig(), make(chan Cmd, 16))
	start := time.Now()
	l.Promote(start, 1)
	for i := range n {
		l.add(start, fsm.Lease{Resource: fmt.Sprintf("r/%07d", i), Token: uint64(i + 1), TTLMs: 60_000})
	}
	now := start.Add(time.Second)
	b.ResetTimer()
	for b.Loop() {
		l.mu.Lock()
		l.checkpoint(now)
		l.mu.Unlock()
	}
	if len(l.out) > 0 {
		b.Fatal("a lease renewed a second ago was checkpointed")
	}
}

// BenchmarkCheckpointEntries: the proposer's share of a mass disconnect's checkpoint storm — sorting a
// million idle checkpoints, in the order the leader's scan found them, by name and splitting them into
// entries (Cmd.entries). It runs off the Ready loop, but on a 2-core node beside both loops.
func BenchmarkCheckpointEntries(b *testing.B) {
	const n = 1_000_000
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("tenant/jobs/%07d", i)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	order := rng.Perm(n)
	cps := make([]*wirepb.LeaseCheckpoint, n)
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		for i, j := range order { // fresh protos each time, allocated in scan order as the lessor does
			cps[i] = &wirepb.LeaseCheckpoint{Resource: names[j], Token: uint64(j + 1), RemainingMs: 1000}
		}
		cmd := Cmd{Batch: 1000, Cmd: &wirepb.Command{Op: &wirepb.Command_Checkpoint{Checkpoint: &wirepb.CheckpointCmd{Leases: slices.Clone(cps)}}}}
		b.StartTimer()
		if got := len(cmd.Entries()); got != n/1000 {
			b.Fatalf("%d entries, want %d", got, n/1000)
		}
	}
}

// BenchmarkLessorLookup: finding a lease's timer by token (every renewal, checkpoint, release and expiry
// applied does) among a million, in random order as renewals and a mass disconnect's checkpoints come;
// and the heap the lessor keeps a lease (lessor-B/lease: timers, token index, the leader's deadline heap;
// the names are the FSM's, not counted).
// Run: go test -run '^$' -bench LessorLookup ./server/internal/lessor/
func BenchmarkLessorLookup(b *testing.B) {
	const n = 1_000_000
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("r/%07d", i)
	}
	before := heapInUse()
	l := New(defaultConfig(), make(chan Cmd, 16))
	start := time.Now()
	l.Promote(start, 1)
	for i := range n {
		l.add(start, fsm.Lease{Resource: names[i], Token: uint64(i + 1), TTLMs: 60_000})
	}
	held := heapInUse() - before
	rng := rand.New(rand.NewPCG(1, 2))
	order := rng.Perm(n)
	i := 0
	b.ResetTimer()
	for b.Loop() {
		j := order[i%n]
		i++
		if l.current(names[j], uint64(j+1)) == nil {
			b.Fatalf("lease %d not found", j)
		}
	}
	b.ReportMetric(float64(held)/n, "lessor-B/lease")
	runtime.KeepAlive(l)
}

// heapInUse is the live heap after a collection.
func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
