package watch

import (
	"bytes"
	"errors"
	"runtime"
	"testing"
	"time"
	"weak"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server/internal/errs"
)

func granted(index uint64, resource string) []fsm.Event {
	return []fsm.Event{{Type: leasepb.EventType_EVENT_TYPE_GRANTED, Index: index, Lease: fsm.Lease{Resource: resource, Token: index}}}
}

func testHub() *Hub { return New(100, 1<<20, 10, 1) }

// drain reads everything w has to read now.
func drain(t *testing.T, h *Hub, w *Watcher) []uint64 {
	t.Helper()
	var got []uint64
	for {
		events, err := h.Read(w, 1<<20)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		if len(events) == 0 {
			return got
		}
		for _, e := range events {
			got = append(got, e.Index)
		}
	}
}

// TestWatcherNeverSeesEventsBeforeItsStart: a node replaying its log after a restart publishes old events;
// a watcher that resumed from a later index must not receive them (indexes must never go backwards).
func TestWatcherNeverSeesEventsBeforeItsStart(t *testing.T) {
	h := testHub()
	w, err := h.Subscribe(50, 0, Matcher("", ""))
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	for i := uint64(40); i <= 55; i++ { // the node replays 40..55
		h.Publish(i, granted(i, "r"))
	}
	if got := drain(t, h, w); len(got) != 6 || got[0] != 50 {
		t.Fatalf("watcher from 50 got %v", got)
	}
}

func TestWatchFromNowStartsAfterTheCommitIndex(t *testing.T) {
	h := testHub()
	w, _ := h.Subscribe(0, 11, Matcher("", ""))
	h.Publish(10, granted(10, "old"))
	h.Publish(11, granted(11, "new"))
	if got := drain(t, h, w); len(got) != 1 || got[0] != 11 {
		t.Fatalf("watch from now got %v, want [11]", got)
	}
}

// TestWatchResumesFromTheRetainedHistory: a watcher from an index inside the history gets exactly the
// matching events from there, across segment boundaries.
func TestWatchResumesFromTheRetainedHistory(t *testing.T) {
	h := New(10_000, 1<<30, 10, 1)
	for i := uint64(1); i <= 3*segmentEvents; i++ {
		r := "a"
		if i%2 == 0 {
			r = "b"
		}
		h.Publish(i, granted(i, r))
	}
	w, err := h.Subscribe(segmentEvents-10, 0, Matcher("b", ""))
	if err != nil {
		t.Fatal(err)
	}
	got := drain(t, h, w)
	if len(got) != segmentEvents+6 || got[0] != segmentEvents-10 || got[len(got)-1] != 3*segmentEvents {
		t.Fatalf("resume from %d got %d events %v..%v", segmentEvents-10, len(got), got[0], got[len(got)-1])
	}
	for i := 1; i < len(got); i++ {
		if got[i] != got[i-1]+2 {
			t.Fatalf("events out of order or missing at %d: %v then %v", i, got[i-1], got[i])
		}
	}
}

// TestWatchHistoryIsBoundedInBytes: with large values the history keeps what fits in WatchHistoryBytes
// (not WatchHistory events), and a watch from an evicted index is told the oldest one it may ask for.
// The newest entry stays even when it alone is over the bound.
func TestWatchHistoryIsBoundedInBytes(t *testing.T) {
	const maxBytes = 64 << 10
	h := New(100_000, maxBytes, 10, 1)
	value := bytes.Repeat([]byte("v"), 4096)
	for i := uint64(1); i <= 1000; i++ {
		h.Publish(i, []fsm.Event{{Type: leasepb.EventType_EVENT_TYPE_GRANTED, Index: i, Lease: fsm.Lease{Resource: "r", Token: i, Value: value}}})
		if _, b := h.Retained(); b > maxBytes {
			t.Fatalf("after %d entries the history holds %d bytes, the bound is %d", i, b, maxBytes)
		}
	}
	n, _ := h.Retained()
	if n < 10 || n > maxBytes/4096 {
		t.Fatalf("history keeps %d events of 4 KiB under a 64 KiB bound", n)
	}
	var ce *errs.Compacted
	if _, err := h.Subscribe(1, 0, Matcher("", "")); !errors.As(err, &ce) || ce.Oldest != uint64(1000-n+1) {
		t.Fatalf("watch from an evicted index: %v, want compacted with oldest %d", err, 1000-n+1)
	}
	big := make([]fsm.Event, 40)
	for k := range big {
		big[k] = fsm.Event{Type: leasepb.EventType_EVENT_TYPE_EXPIRED, Index: 1001, Lease: fsm.Lease{Resource: "r", Value: value}}
	}
	w, _ := h.Subscribe(1001, 0, Matcher("", ""))
	h.Publish(1001, big)
	if got := drain(t, h, w); len(got) != 40 {
		t.Fatalf("an entry over the bound reached the watcher with %d of its 40 events", len(got))
	}
}

// TestSlowWatcherIsCutOff: a watcher whose cursor the history evicted before it read there fails with
// errWatchFellBehind instead of holding events for it; one that kept up is unaffected.
func TestSlowWatcherIsCutOff(t *testing.T) {
	h := New(10, 1<<20, 10, 1)
	slow, _ := h.Subscribe(0, 1, Matcher("", ""))
	quick, _ := h.Subscribe(0, 1, Matcher("", ""))
	for i := uint64(1); i <= 30; i++ {
		h.Publish(i, granted(i, "r"))
		drain(t, h, quick)
	}
	if _, err := h.Read(slow, 1<<20); !errors.Is(err, errWatchFellBehind) {
		t.Fatalf("slow watcher read: %v, want it cut off", err)
	}
	if n, _ := h.Retained(); n != 10 {
		t.Fatalf("history holds %d events, want 10", n)
	}
}

// TestPublishNeverWaitsForAWatcher: while a watcher is in the middle of reading a long history (here it
// blocks in its match function), the apply path's publish completes. The old hub copied a new watcher's
// backlog under the lock publish needs, so 4,000 watches from index 1 stalled the apply loop.
func TestPublishNeverWaitsForAWatcher(t *testing.T) {
	h := New(100_000, 1<<30, 10, 1)
	for i := uint64(1); i <= 1000; i++ {
		h.Publish(i, granted(i, "r"))
	}
	inMatch, release := make(chan struct{}), make(chan struct{})
	first := true
	w, err := h.Subscribe(1, 0, func(string) bool {
		if first {
			first = false
			close(inMatch)
			<-release
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		_, _ = h.Read(w, 1<<20)
	}()
	<-inMatch
	published := make(chan struct{})
	go func() {
		h.Publish(1001, granted(1001, "r"))
		close(published)
	}()
	select {
	case <-published:
	case <-time.After(10 * time.Second):
		t.Error("publish waited for a watcher reading the history")
	}
	close(release)
	<-readDone
	<-published
}

// TestWatcherLimit: past maxWatchers a subscription is refused with the flag's name; unsubscribing
// frees a place.
func TestWatcherLimit(t *testing.T) {
	h := New(100, 1<<20, 2, 1)
	a, _ := h.Subscribe(0, 1, Matcher("", ""))
	if _, err := h.Subscribe(0, 1, Matcher("", "")); err != nil {
		t.Fatal(err)
	}
	_, err := h.Subscribe(0, 1, Matcher("", ""))
	var le *errs.Limit
	if !errors.As(err, &le) || le.Flag != "--max-watchers" {
		t.Fatalf("third watcher: %v, want a --max-watchers refusal", err)
	}
	h.Unsubscribe(a)
	if _, err := h.Subscribe(0, 1, Matcher("", "")); err != nil {
		t.Fatalf("after one left: %v", err)
	}
}

// TestHistoryEvictsAcrossSegments: a small history over many segments keeps exactly its bound, and
// every retained event is where a reader looks for it.
func TestHistoryEvictsAcrossSegments(t *testing.T) {
	for _, bound := range []int{1, segmentEvents - 1, segmentEvents, segmentEvents + 1, 3 * segmentEvents} {
		h := New(bound, 1<<40, 10, 1)
		for i := uint64(1); i <= 5*segmentEvents+7; i++ {
			h.Publish(i, granted(i, "r"))
			if n, _ := h.Retained(); n != min(int(i), bound) {
				t.Fatalf("bound %d, after %d entries: %d retained", bound, i, n)
			}
		}
		from := uint64(5*segmentEvents + 7 - bound + 1)
		w, err := h.Subscribe(from, 0, Matcher("", ""))
		if err != nil {
			t.Fatalf("bound %d: subscribe from %d: %v", bound, from, err)
		}
		got := drain(t, h, w)
		if len(got) != bound || got[0] != from {
			t.Fatalf("bound %d: read %d events from %v, want %d from %d", bound, len(got), got[:1], bound, from)
		}
	}
}

// TestNotifierWakesOnlyMatchingWatchers: a sleeping watcher is not woken for events it does not match,
// and the notifier moves its cursor past them, so it does not fall behind while the history turns over
// many times; an event it matches wakes it, and it reads exactly that.
func TestNotifierWakesOnlyMatchingWatchers(t *testing.T) {
	h := New(10, 1<<20, 10, 1)
	w, _ := h.Subscribe(0, 1, Matcher("", "x/"))
	wake, leave := h.Sleep(w)
	defer leave()
	for i := uint64(1); i <= 1000; i++ {
		h.Publish(i, granted(i, "r"))
		h.round()
	}
	select {
	case <-wake:
		t.Fatal("woken for events it does not match")
	default:
	}
	h.Publish(1001, granted(1001, "x/1"))
	h.round()
	select {
	case <-wake:
	default:
		t.Fatal("not woken for an event it matches")
	}
	if got := drain(t, h, w); len(got) != 1 || got[0] != 1001 {
		t.Fatalf("read %v after the wake, want [1001]", got)
	}
}

// TestEvictedHistorySegmentsAreFreed: a segment the history evicted is garbage soon after, not kept by
// the slice's array until an append happens to move it (which kept up to twice the retained history
// alive, and every name its events referenced).
func TestEvictedHistorySegmentsAreFreed(t *testing.T) {
	const retained = 64 // segments
	h := New(retained*segmentEvents, 1<<30, 10, 1)
	var made []weak.Pointer[segment]
	for i := uint64(1); i <= 4*retained*segmentEvents; i++ {
		h.Publish(i, granted(i, "r"))
		if segs := h.segs; len(made) < int(i+segmentEvents-1)/segmentEvents {
			made = append(made, weak.Make(segs[len(segs)-1]))
		}
	}
	runtime.GC()
	evicted := len(made) - len(h.segs)
	alive := 0
	for _, p := range made[:evicted] {
		if p.Value() != nil {
			alive++
		}
	}
	if alive > retained/4+1 {
		t.Fatalf("%d of %d evicted segments are still alive beside the %d retained", alive, evicted, len(h.segs))
	}
}
