package server

import (
	"testing"

	"github.com/leased/leased/api/wirepb"
)

// A waiter has at most one grant in flight: a release cannot claim a waiter that is proposing its own
// Acquire, and a claimed waiter does not propose one, until the claim's outcome is known.
func TestWaiterIsNeverClaimedAndTryingAtOnce(t *testing.T) {
	q := newWaitQueue(10, 10)
	cmd := &wirepb.AcquireCmd{Resource: "r", Holder: "h", TtlMs: 1000}
	w, err := q.enqueue("r", cmd, 7)
	if err != nil {
		t.Fatal(err)
	}
	behind, _ := q.enqueue("r", cmd, 8)
	if head, err := q.head("r", w); !head || err != nil {
		t.Fatalf("head: %v %v", head, err)
	}
	if !q.begin(w) {
		t.Fatal("an unclaimed head may not propose")
	}
	if q.claim("r") != nil {
		t.Fatal("claimed a waiter that is trying")
	}
	q.end(w)
	if q.claim("r") != w {
		t.Fatal("the idle head was not claimed")
	}
	if q.claim("r") != nil {
		t.Fatal("claimed twice")
	}
	if head, _ := q.head("r", w); head || q.begin(w) {
		t.Fatal("a claimed waiter may try on its own")
	}
	if acq, id := q.carried(w); acq != cmd || id != 7 {
		t.Fatalf("carried %v %d", acq, id)
	}
	q.rearm(w, 9) // the entry refused it: claimable again, under a new proposal id
	if q.claim("r") != w {
		t.Fatal("not claimable after rearm")
	}
	if _, id := q.carried(w); id != 9 {
		t.Fatalf("proposal id %d after rearm", id)
	}
	q.unclaim(w)
	if head, _ := q.head("r", w); !head {
		t.Fatal("not the head after unclaim")
	}
	q.leave("r", w) // only the head is ever claimed
	if q.claim("r") != behind {
		t.Fatal("the next waiter did not become claimable")
	}
	q.failAll(ErrNotLeader)
	if q.claim("r") != nil {
		t.Fatal("claimed a failed waiter")
	}
	if nocmd, _ := q.enqueue("s", nil, 1); nocmd == nil || q.claim("s") != nil {
		t.Fatal("claimed a waiter without a command")
	}
}
