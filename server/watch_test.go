package server

import (
	"testing"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/fsm"
)

func granted(index uint64, resource string) []fsm.Event {
	return []fsm.Event{{Type: leasepb.EventType_EVENT_TYPE_GRANTED, Index: index, Lease: fsm.Lease{Resource: resource, Token: index}}}
}

// TestWatcherNeverSeesEventsBeforeItsStart: a node replaying its log after a restart publishes old events;
// a watcher that resumed from a later index must not receive them (indexes must never go backwards).
func TestWatcherNeverSeesEventsBeforeItsStart(t *testing.T) {
	h := newWatchHub(100, 1)
	w, backlog, err := h.subscribe(50, 0, matcher("", ""))
	if err != nil || len(backlog) != 0 {
		t.Fatalf("subscribe: %v %v", backlog, err)
	}
	for i := uint64(40); i <= 55; i++ { // the node replays 40..55
		h.publish(i, granted(i, "r"))
	}
	h.unsubscribe(w)
	var got []uint64
	for batch := range w.ch {
		for _, e := range batch {
			got = append(got, e.Index)
		}
	}
	if len(got) != 6 || got[0] != 50 {
		t.Fatalf("watcher from 50 got %v", got)
	}
}

func TestWatchFromNowStartsAfterTheCommitIndex(t *testing.T) {
	h := newWatchHub(100, 1)
	w, _, _ := h.subscribe(0, 11, matcher("", ""))
	h.publish(10, granted(10, "old"))
	h.publish(11, granted(11, "new"))
	h.unsubscribe(w)
	var got []uint64
	for batch := range w.ch {
		for _, e := range batch {
			got = append(got, e.Index)
		}
	}
	if len(got) != 1 || got[0] != 11 {
		t.Fatalf("watch from now got %v, want [11]", got)
	}
}
