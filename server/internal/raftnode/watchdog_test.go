package raftnode

import (
	"testing"
	"time"
)

// TestWriteAgeDiscountsAStoppedProcess: a write in flight ages at the watchdog's ticks, but a gap between
// two ticks counts for two periods at most. A node SIGSTOPped for 11 s mid-write used to stop itself on
// waking (its 10 s disk stall timeout exceeded), though its disk never stalled; a disk that stalls while
// the process runs still trips the timeout.
func TestWriteAgeDiscountsAStoppedProcess(t *testing.T) {
	const period, timeout = 100 * time.Millisecond, 800 * time.Millisecond
	t0 := time.Now()
	w := writeAge{period: period, last: t0}
	const start = 42 // writeStart of the write in flight
	now := t0.Add(period)
	w.observe(now, start, 10*time.Millisecond, true)
	now = now.Add(11 * time.Second) // the process was stopped
	if got := w.observe(now, start, 11*time.Second, true); got > 3*period {
		t.Fatalf("age after an 11 s freeze counted as %v, want at most three periods", got)
	}
	// The disk stalls while the process runs: every tick counts in full, and the timeout trips.
	var got time.Duration
	for i := 0; got <= timeout; i++ {
		if i > 20 {
			t.Fatalf("a stalled write never passed the timeout: %v after %d ticks", got, i)
		}
		now = now.Add(period)
		got = w.observe(now, start, 0, true)
	}
	// The write returns; the next one starts from zero.
	if got := w.observe(now.Add(period), 0, 0, false); got != 0 {
		t.Fatalf("age with nothing in flight %v", got)
	}
	if got := w.observe(now.Add(2*period), 43, 5*time.Millisecond, true); got != 5*time.Millisecond {
		t.Fatalf("age of a new write %v, want its own 5ms", got)
	}
}
