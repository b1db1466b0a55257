package waitq

import (
	"errors"
	"testing"

	"github.com/leased/leased/api/wirepb"
)

// A waiter has at most one grant in flight: a release cannot claim a waiter that is proposing its own
// Acquire, and a claimed waiter does not propose one, until the claim's outcome is known.
func TestWaiterIsNeverClaimedAndTryingAtOnce(t *testing.T) {
	q := New(10, 10, 10)
	cmd := &wirepb.AcquireCmd{Resource: "r", Holder: "h", TtlMs: 1000}
	w, err := q.Enqueue("r", cmd, 7)
	if err != nil {
		t.Fatal(err)
	}
	behind, _ := q.Enqueue("r", cmd, 8)
	if head, err := q.Head("r", w); !head || err != nil {
		t.Fatalf("head: %v %v", head, err)
	}
	if !q.Begin(w) {
		t.Fatal("an unclaimed head may not propose")
	}
	if q.Claim("r") != nil {
		t.Fatal("claimed a waiter that is trying")
	}
	q.End(w)
	if q.Claim("r") != w {
		t.Fatal("the idle head was not claimed")
	}
	if q.Claim("r") != nil {
		t.Fatal("claimed twice")
	}
	if head, _ := q.Head("r", w); head || q.Begin(w) {
		t.Fatal("a claimed waiter may try on its own")
	}
	if acq, id := q.Carried(w); acq != cmd || id != 7 {
		t.Fatalf("carried %v %d", acq, id)
	}
	q.Rearm(w, 9) // the entry refused it: claimable again, under a new proposal id
	if q.Claim("r") != w {
		t.Fatal("not claimable after rearm")
	}
	if _, id := q.Carried(w); id != 9 {
		t.Fatalf("proposal id %d after rearm", id)
	}
	q.Unclaim(w)
	if head, _ := q.Head("r", w); !head {
		t.Fatal("not the head after unclaim")
	}
	q.Leave("r", w) // only the head is ever claimed
	if q.Claim("r") != behind {
		t.Fatal("the next waiter did not become claimable")
	}
	q.FailAll(errors.New("not the leader"))
	if q.Claim("r") != nil {
		t.Fatal("claimed a failed waiter")
	}
	if nocmd, _ := q.Enqueue("s", nil, 1); nocmd == nil || q.Claim("s") != nil {
		t.Fatal("claimed a waiter without a command")
	}
}

// A waiter whose wait ends leaves at once, unless a release carries its Acquire: that entry's outcome is
// then its answer, and it stays (claimable again, and withdrawable, once the outcome was a refusal).
func TestWithdrawWaitsForACarriedAcquire(t *testing.T) {
	q := New(10, 10, 10)
	cmd := &wirepb.AcquireCmd{Resource: "r", Holder: "h", TtlMs: 1000}
	w, _ := q.Enqueue("r", cmd, 7)
	behind, _ := q.Enqueue("r", cmd, 8)
	if q.Claim("r") != w {
		t.Fatal("the idle head was not claimed")
	}
	if q.Withdraw("r", w) {
		t.Fatal("withdrew a waiter a release carries")
	}
	if q.Len() != 2 {
		t.Fatalf("queue holds %d waiters, want 2", q.Len())
	}
	q.Rearm(w, 9) // the release's entry refused it: the resource was not free after all
	if !q.Withdraw("r", w) {
		t.Fatal("a waiter no release carries must leave when its wait ends")
	}
	if head, err := q.Head("r", behind); !head || err != nil || q.Len() != 1 {
		t.Fatalf("after the head withdrew: head %v %v, %d waiters; want the next one at the head, alone", head, err, q.Len())
	}
	select {
	case <-behind.wake:
	default:
		t.Fatal("the new head was not woken")
	}
	q.Leave("r", w) // the acquire's deferred leave: a no-op now
	if q.Len() != 1 {
		t.Fatalf("leave after withdraw changed the queue: %d waiters", q.Len())
	}
}

// Losing leadership fails the waiters, but not one a release carries: that release's entry may still
// commit under the next leader and grant it, so a definite "not the leader" would be a wrong answer; its
// answer is the entry's outcome, delivered by its proposal id (or "outcome unknown").
func TestFailAllLeavesACarriedWaiterToItsEntry(t *testing.T) {
	q := New(10, 10, 10)
	cmd := &wirepb.AcquireCmd{Resource: "r", Holder: "h", TtlMs: 1000}
	carried, _ := q.Enqueue("r", cmd, 7)
	idle, _ := q.Enqueue("s", cmd, 8)
	if q.Claim("r") != carried {
		t.Fatal("the idle head was not claimed")
	}
	q.FailAll(errors.New("not the leader"))
	if _, err := q.Head("s", idle); err == nil {
		t.Fatal("an unclaimed waiter was not failed")
	}
	select {
	case <-carried.Wake():
		t.Fatal("the carried waiter was woken to a failure")
	default:
	}
	if head, err := q.Head("r", carried); head || err != nil {
		t.Fatalf("the carried waiter: head %v, err %v; want neither (its entry answers it)", head, err)
	}
	if q.Len() != 0 {
		t.Fatalf("queue holds %d waiters after FailAll, want 0", q.Len())
	}
}
