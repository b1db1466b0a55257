package server

import (
	"fmt"
	"testing"
	"time"

	"github.com/leased/leased/fsm"
)

// BenchmarkCheckpointScan: one checkpoint scan of a leader holding a million leases, none of them due
// (all renewed a second ago): the time the Ready loop and the lessor's lock are held every scan period
// (a quarter of --checkpoint-interval), whatever the leases do.
// Run: go test -run '^$' -bench CheckpointScan -benchtime 10x ./server/
func BenchmarkCheckpointScan(b *testing.B) {
	const n = 1_000_000
	l := newLessor(DefaultConfig(), make(chan lessorCmd, 16))
	start := time.Now()
	l.promote(start, 1)
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
