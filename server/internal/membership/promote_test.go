package membership

import (
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/tracker"
)

// learnerSamples feeds a tracker one sample per tick, for ticks ticks, of a leader (id 1, last index 1000)
// with one learner (id 4) whose match and RecentActive the functions give per tick. It returns the tick at
// which the tracker first named the learner, or -1.
func learnerSamples(tr *learnerTracker, tick time.Duration, ticks int, match func(int) uint64, active func(int) bool) int {
	start := time.Unix(1_000_000, 0)
	for i := range ticks {
		st := raft.Status{Progress: map[uint64]tracker.Progress{
			1: {Match: 1000, RecentActive: true},
			2: {Match: 1000, RecentActive: true},
			4: {Match: match(i), RecentActive: active(i), IsLearner: true},
		}}
		if id, ok := tr.observe(1, st, start.Add(time.Duration(i)*tick)); ok {
			if id != 4 {
				panic("tracker named a voter")
			}
			return i
		}
	}
	return -1
}

func TestLearnerTracker(t *testing.T) {
	const tick, et = 100 * time.Millisecond, time.Second // ten ticks per election timeout, as configured
	caughtUpAt := func(int) uint64 { return 1000 }
	for _, c := range []struct {
		name   string
		match  func(int) uint64
		active func(int) bool
		want   int // tick of promotion, -1 for never
	}{
		// An idle learner: raft clears RecentActive at each quorum check (every ten ticks) and the next
		// heartbeat answer sets it again a tick later. Sampling once per election timeout at that phase saw
		// it inactive every time (the soak's 51-second stall); every tick, it is promoted on time.
		{"idle, inactive right after each quorum check", caughtUpAt, func(i int) bool { return i%10 != 0 }, 51},
		{"seen active once per election timeout", caughtUpAt, func(i int) bool { return i%10 == 5 }, 55},
		{"never heard from", caughtUpAt, func(int) bool { return false }, -1},
		// It stops answering at tick 30: after an election timeout of silence it is no longer ready, and it
		// is not promoted on the strength of its earlier answers.
		{"falls silent", caughtUpAt, func(i int) bool { return i < 30 }, -1},
		{"behind", func(int) uint64 { return 1000 - promoteLag - 1 }, func(int) bool { return true }, -1},
		// Behind until tick 20, then caught up: five election timeouts counted from then.
		{"catches up late", func(i int) uint64 { return map[bool]uint64{true: 10, false: 1000}[i < 20] }, func(int) bool { return true }, 70},
	} {
		tr := &learnerTracker{activeWithin: et, promoteAfter: 5 * et}
		if got := learnerSamples(tr, tick, 200, c.match, c.active); got != c.want {
			t.Errorf("%s: promoted at tick %d, want %d", c.name, got, c.want)
		}
	}
}

func TestLearnerTrackerForgetsRemovedLearners(t *testing.T) {
	tr := &learnerTracker{activeWithin: time.Second, promoteAfter: 5 * time.Second}
	now := time.Unix(1_000_000, 0)
	tr.observe(1, raft.Status{Progress: map[uint64]tracker.Progress{
		1: {Match: 1000}, 4: {Match: 1000, RecentActive: true, IsLearner: true},
	}}, now)
	if len(tr.learners) != 1 {
		t.Fatalf("tracker holds %d learners, want 1", len(tr.learners))
	}
	tr.observe(1, raft.Status{Progress: map[uint64]tracker.Progress{1: {Match: 1000}}}, now.Add(time.Second))
	if len(tr.learners) != 0 {
		t.Fatalf("tracker still holds a removed learner")
	}
}
