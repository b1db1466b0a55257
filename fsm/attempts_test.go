package fsm

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/leased/leased/api/wirepb"
)

// attempt is an Acquire of resource by holder under request id, numbered n, as the SDK sends it.
func attempt(resource, holder, requestID string, n uint32) *wirepb.Command {
	return acqWith(&wirepb.AcquireCmd{Resource: resource, Holder: holder, TtlMs: 10_000, RequestId: requestID, Attempt: n})
}

func waitingAttempt(resource, holder, requestID string, n uint32) *wirepb.Command {
	cmd := attempt(resource, holder, requestID, n)
	cmd.GetAcquire().Wait = true
	return cmd
}

func wantCode(t *testing.T, what string, res Result, want Code) {
	t.Helper()
	if res.Code != want {
		t.Fatalf("%s: code %v, want %v (result %+v)", what, res.Code, want, res)
	}
	if want == Superseded && len(res.Events) != 0 {
		t.Fatalf("%s: a superseded attempt made events %+v", what, res.Events)
	}
}

// The soak's finding: attempt 1 is delayed, attempt 2 is answered Held, the holder's lease expires, and
// only then does attempt 1 apply. It must not grant.
func TestStaleAttemptAfterRefusalIsSuperseded(t *testing.T) {
	a := newApplier(t)
	w1 := a.apply(attempt("hot/74/0", "w1", "r1", 1)) // index 1
	wantCode(t, "w1", w1, OK)
	wantCode(t, "w5 attempt 2", a.apply(attempt("hot/74/0", "w5", "X", 2)), Held)
	a.apply(expire("hot/74/0", 1))
	res := a.apply(attempt("hot/74/0", "w5", "X", 1))
	wantCode(t, "w5 attempt 1, late", res, Superseded)
	if s := res.Stale; s.RequestID != "X" || s.Attempt != 1 || s.Answered != 2 || s.GrantEnded {
		t.Fatalf("stale = %+v", s)
	}
	if _, held := a.f.Get("hot/74/0"); held {
		t.Fatal("the stale attempt left a grant")
	}
	// The same number again is stale too; the state did not change.
	wantCode(t, "attempt 2 again", a.apply(attempt("hot/74/0", "w5", "X", 2)), Superseded)
}

func TestNewerAttemptOfRefusedIntentIsGranted(t *testing.T) {
	a := newApplier(t)
	a.apply(attempt("r", "w1", "r1", 1))
	wantCode(t, "attempt 1", a.apply(attempt("r", "w5", "X", 1)), Held)
	a.apply(rel("r", 1))
	res := a.apply(attempt("r", "w5", "X", 2))
	wantCode(t, "attempt 2", res, OK)
	if res.Replayed || res.Lease.Holder != "w5" {
		t.Fatalf("attempt 2 = %+v", res)
	}
	// While the grant is live every attempt, stale or not, replays it: it is the intent's answer.
	again := a.apply(attempt("r", "w5", "X", 1))
	wantCode(t, "attempt 1 while granted", again, OK)
	if !again.Replayed || again.Lease.Token != res.Lease.Token {
		t.Fatalf("attempt 1 while granted = %+v", again)
	}
}

func TestAttemptAfterGrantEndedIsSuperseded(t *testing.T) {
	for _, end := range []string{"released", "expired"} {
		t.Run(end, func(t *testing.T) {
			a := newApplier(t)
			granted := a.apply(attempt("r", "w5", "X", 2)) // index 1
			wantCode(t, "attempt 2", granted, OK)
			if end == "released" {
				a.apply(rel("r", 1))
			} else {
				a.apply(expire("r", 1))
			}
			for _, n := range []uint32{1, 2, 3} {
				res := a.apply(attempt("r", "w5", "X", n))
				wantCode(t, fmt.Sprintf("attempt %d after the grant %s", n, end), res, Superseded)
				if !res.Stale.GrantEnded {
					t.Fatalf("stale = %+v", res.Stale)
				}
			}
			if _, held := a.f.Get("r"); held {
				t.Fatal("a stale attempt granted again")
			}
		})
	}
}

func TestSemaphoreSlotAttempts(t *testing.T) {
	slot := func(holder, id string, n uint32) *wirepb.Command {
		cmd := attempt("sem", holder, id, n)
		cmd.GetAcquire().Limit = 1
		return cmd
	}
	a := newApplier(t)
	wantCode(t, "w1", a.apply(slot("w1", "r1", 1)), OK) // index 1
	wantCode(t, "w5 attempt 2", a.apply(slot("w5", "X", 2)), Held)
	a.apply(rel("sem", 1))
	wantCode(t, "w5 attempt 1, late", a.apply(slot("w5", "X", 1)), Superseded)
	got := a.apply(slot("w5", "X", 3)) // index 5
	wantCode(t, "w5 attempt 3", got, OK)
	a.apply(expire("sem", int(got.Lease.Token)))
	wantCode(t, "w5 attempt 3 after expiry", a.apply(slot("w5", "X", 3)), Superseded)
}

// A blocking acquire's proposals are re-made by the server while it waits: their Held is no answer, and
// the waiting attempt is granted when the resource frees. A stale non-waiting attempt is still refused.
func TestWaitingAttemptHeldIsNotAnAnswer(t *testing.T) {
	a := newApplier(t)
	a.apply(attempt("r", "w1", "r1", 1))                                       // index 1
	wantCode(t, "attempt 1", a.apply(attempt("r", "w5", "X", 1)), Held)        // the SDK asks without waiting
	wantCode(t, "attempt 2", a.apply(waitingAttempt("r", "w5", "X", 2)), Held) // then waits
	a.apply(rel("r", 1))
	wantCode(t, "attempt 2, re-proposed", a.apply(waitingAttempt("r", "w5", "X", 2)), OK)

	b := newApplier(t)
	b.apply(attempt("r", "w1", "r1", 1))
	b.apply(attempt("r", "w5", "X", 1))
	b.apply(waitingAttempt("r", "w5", "X", 2))
	b.apply(rel("r", 1))
	wantCode(t, "attempt 1, late", b.apply(attempt("r", "w5", "X", 1)), Superseded)
}

// Entries without attempt numbers (logs of earlier versions, old clients) apply exactly as before, to
// the same state: a refused request id is granted later, and a request id whose grant ended is granted
// again.
func TestUnnumberedAttemptsUnchanged(t *testing.T) {
	a := newApplier(t)
	a.apply(acq("r", "w1", "r1"))
	wantCode(t, "held", a.apply(attempt("r", "w5", "X", 0)), Held)
	a.apply(rel("r", 1))
	wantCode(t, "after release", a.apply(attempt("r", "w5", "X", 0)), OK) // index 4
	a.apply(rel("r", 4))
	wantCode(t, "after its grant ended", a.apply(attempt("r", "w5", "X", 0)), OK)
	if n := a.f.answered.len(); n != 2 {
		t.Fatalf("remembered %d intents, want 2 (the ended grants of r1 and X)", n)
	}
	for _, id := range []string{"r1", "X"} {
		if r := a.f.answered.byKey[requestKey{holder: map[string]string{"r1": "w1", "X": "w5"}[id], id: id}]; r == nil || r.attempt != 0 {
			t.Fatalf("%s: record %+v, want an ended grant without a refused attempt", id, r)
		}
	}
}

func TestAnsweredRequestsSurviveSnapshot(t *testing.T) {
	a := newApplier(t)
	a.apply(attempt("r", "w1", "r1", 1)) // index 1, granted
	a.apply(attempt("r", "w5", "X", 3))  // refused at 3
	a.apply(rel("r", 1))                 // r1's grant ended
	a.apply(attempt("q", "w6", "Y", 1))  // index 4, granted
	a.apply(acqWith(&wirepb.AcquireCmd{Resource: "q", Holder: "h", Identity: "alice", TtlMs: 10_000, RequestId: "Z", Attempt: 2}))
	snap := mustSnapshot(t, a.f)
	g, err := Restore(snap)
	if err != nil {
		t.Fatal(err)
	}
	if again := mustSnapshot(t, g); !bytes.Equal(snap, again) {
		t.Fatal("the restored state encodes differently")
	}
	b := &applier{t: t, f: g, next: a.next}
	for _, c := range []struct {
		what string
		cmd  *wirepb.Command
		want Code
	}{
		{"X attempt 2", attempt("r", "w5", "X", 2), Superseded},
		{"r1 after its grant ended", attempt("r", "w1", "r1", 5), Superseded},
		{"alice's Z attempt 1", acqWith(&wirepb.AcquireCmd{Resource: "q", Holder: "h", Identity: "alice", TtlMs: 10_000, RequestId: "Z", Attempt: 1}), Superseded},
		{"X attempt 4", attempt("r", "w5", "X", 4), OK},
	} {
		wantCode(t, c.what, b.apply(c.cmd), c.want)
	}
}

func TestRestoreRejectsBadAnsweredRecords(t *testing.T) {
	for name, r := range map[string]*wirepb.AnsweredRequestRecord{
		"no request id":       {Holder: "h", AnsweredAttempt: 1},
		"holder and identity": {Holder: "h", Identity: "i", RequestId: "x", AnsweredAttempt: 1},
		"neither":             {RequestId: "x", AnsweredAttempt: 1},
		"nothing remembered":  {Holder: "h", RequestId: "x"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := fromBody(&wirepb.SnapshotBody{AnsweredRequests: []*wirepb.AnsweredRequestRecord{r}}, leaseRecords{}); err == nil {
				t.Fatal("restored")
			}
		})
	}
	dup := &wirepb.AnsweredRequestRecord{Holder: "h", RequestId: "x", GrantEnded: true}
	if _, err := fromBody(&wirepb.SnapshotBody{AnsweredRequests: []*wirepb.AnsweredRequestRecord{dup, dup}}, leaseRecords{}); err == nil {
		t.Fatal("restored a repeated key")
	}
}

// The memory keeps MaxRememberedRequests intents and forgets the oldest first; a forgotten intent's stale
// attempt is decided as without attempt numbers.
func TestAnsweredRequestsEvictOldestFirst(t *testing.T) {
	a := newApplier(t)
	a.apply(attempt("r", "w1", "r1", 1)) // holds r: every attempt below is refused
	for i := range MaxRememberedRequests + 2 {
		wantCode(t, "refused", a.apply(attempt("r", "w5", fmt.Sprint("id-", i), 2)), Held)
	}
	if n := a.f.answered.len(); n != MaxRememberedRequests {
		t.Fatalf("remembered %d, want %d", n, MaxRememberedRequests)
	}
	wantCode(t, "id-2 (remembered)", a.apply(attempt("r", "w5", "id-2", 1)), Superseded)
	// A forgotten intent is decided as without attempt numbers, and its refusal is remembered anew,
	// evicting the oldest (id-2, then id-3).
	for _, id := range []string{"id-0", "id-1"} {
		wantCode(t, id+" (forgotten)", a.apply(attempt("r", "w5", id, 1)), Held)
	}
	// Two nodes applying the same entries, one restored from a snapshot midway, remember the same keys.
	g, err := Restore(mustSnapshot(t, a.f))
	if err != nil {
		t.Fatal(err)
	}
	b := &applier{t: t, f: g, next: a.next}
	for i := range 3 {
		a.apply(attempt("r", "w5", fmt.Sprint("more-", i), 2))
		b.apply(attempt("r", "w5", fmt.Sprint("more-", i), 2))
	}
	if !bytes.Equal(mustSnapshot(t, a.f), mustSnapshot(t, b.f)) {
		t.Fatal("the applied and the restored node remember different intents")
	}
	// The three new ones evicted id-4, id-5 and id-6.
	wantCode(t, "id-6 (forgotten)", b.apply(attempt("r", "w5", "id-6", 1)), Held)
	wantCode(t, "id-8 (remembered)", b.apply(attempt("r", "w5", "id-8", 1)), Superseded)
	wantCode(t, "id-0 (remembered anew)", b.apply(attempt("r", "w5", "id-0", 1)), Superseded)
}

// A release that carries the head waiter's acquire (ReleaseHandoff) applies it as an Acquire entry of its
// own would: a stale attempt is not granted by the handoff either.
func TestHandoffOfAStaleAttemptDoesNotGrant(t *testing.T) {
	handoff := func(token uint64, carried *wirepb.Command) *wirepb.Command {
		return &wirepb.Command{Op: &wirepb.Command_ReleaseHandoff{ReleaseHandoff: &wirepb.ReleaseHandoffCmd{
			Release: &wirepb.ReleaseCmd{Resource: "r", Token: token}, Acquire: carried.GetAcquire(),
		}}}
	}
	a := newApplier(t)
	a.apply(attempt("r", "w1", "r1", 1))                                // index 1
	wantCode(t, "attempt 2", a.apply(attempt("r", "w5", "X", 2)), Held) // answered
	res := a.apply(handoff(1, waitingAttempt("r", "w5", "X", 1)))
	if res.Handoff == nil || res.Handoff.Code != Superseded {
		t.Fatalf("handoff of stale attempt 1 = %+v", res.Handoff)
	}
	if _, held := a.f.Get("r"); held {
		t.Fatal("the handoff granted a stale attempt")
	}
	a.apply(attempt("r", "w1", "r2", 1)) // index 4
	res = a.apply(handoff(4, waitingAttempt("r", "w5", "X", 3)))
	if res.Handoff == nil || res.Handoff.Code != OK || res.Handoff.Lease.Holder != "w5" {
		t.Fatalf("handoff of attempt 3 = %+v", res.Handoff)
	}
}
