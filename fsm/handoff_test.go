package fsm

import (
	"bytes"
	"testing"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
)

func waiterCmd(resource, holder, requestID string) *wirepb.AcquireCmd {
	return &wirepb.AcquireCmd{Resource: resource, Holder: holder, TtlMs: 10_000, RequestId: requestID}
}

// A ReleaseHandoff releases the lease and grants the resource to the waiter in one entry: the grant's
// token is the entry's index, and the events are the release's, then the grant's.
func TestReleaseHandoffReleasesThenGrantsInOneEntry(t *testing.T) {
	a := newApplier(t)
	a.apply(acq("r", "alice", "a1"))                             // token 1
	res := a.apply(handoff("r", 1, waiterCmd("r", "bob", "b1"))) // index 2
	if res.Code != OK || res.Lease.Token != 1 || res.Replayed {
		t.Fatalf("release part: %+v", res)
	}
	if res.Handoff == nil || res.Handoff.Code != OK || res.Handoff.Lease.Token != 2 || res.Handoff.Lease.Holder != "bob" {
		t.Fatalf("handoff part: %+v", res.Handoff)
	}
	if len(res.Events) != 2 || res.Events[0].Type != leasepb.EventType_EVENT_TYPE_RELEASED || res.Events[0].Lease.Token != 1 ||
		res.Events[1].Type != leasepb.EventType_EVENT_TYPE_GRANTED || res.Events[1].Lease.Token != 2 ||
		res.Events[0].Index != 2 || res.Events[1].Index != 2 {
		t.Fatalf("events: %+v", res.Events)
	}
	if l, ok := a.f.Get("r"); !ok || l.Token != 2 || l.Holder != "bob" {
		t.Fatalf("state: %+v %v", l, ok)
	}
	if a.f.HighestToken() != 2 {
		t.Fatalf("highest token %d", a.f.HighestToken())
	}
	// The first holder's retried release is replayed; the waiter's retried acquire gets its grant back.
	if r := a.apply(rel("r", 1)); r.Code != OK || !r.Replayed || r.End.Index != 2 {
		t.Fatalf("retried release: %+v", r)
	}
	if r := a.apply(acqWith(waiterCmd("r", "bob", "b1"))); r.Code != OK || !r.Replayed || r.Lease.Token != 2 {
		t.Fatalf("retried acquire: %+v", r)
	}
}

// The carried Acquire is refused by the usual rules, and then changes nothing: the release alone applies.
func TestReleaseHandoffRefusals(t *testing.T) {
	t.Run("release of a stale token leaves the resource held", func(t *testing.T) {
		a := newApplier(t)
		a.apply(acq("r", "alice", "a1"))
		res := a.apply(handoff("r", 9, waiterCmd("r", "bob", "b1")))
		if res.Code != NotCurrent || res.Handoff == nil || res.Handoff.Code != Held || res.Handoff.Lease.Token != 1 || len(res.Events) != 0 {
			t.Fatalf("%+v / %+v", res, res.Handoff)
		}
	})
	t.Run("lock-delay", func(t *testing.T) {
		a := newApplier(t)
		a.apply(acqWith(&wirepb.AcquireCmd{Resource: "r", Holder: "alice", TtlMs: 10, LockDelayMs: 5000})) // 1
		a.apply(expire("r", 1))                                                                            // 2: delayed
		res := a.apply(handoff("r", 1, waiterCmd("r", "bob", "b1")))
		if res.Handoff == nil || res.Handoff.Code != LockDelayed || len(res.Events) != 0 {
			t.Fatalf("%+v / %+v", res, res.Handoff)
		}
		if _, held := a.f.Get("r"); held {
			t.Fatal("granted during the lock-delay")
		}
	})
	t.Run("a voluntary release of a lease with a lock-delay hands over at once", func(t *testing.T) {
		a := newApplier(t)
		a.apply(acqWith(&wirepb.AcquireCmd{Resource: "r", Holder: "alice", TtlMs: 10, LockDelayMs: 5000})) // 1
		res := a.apply(handoff("r", 1, waiterCmd("r", "bob", "b1")))
		if res.Handoff == nil || res.Handoff.Code != OK || res.Handoff.Lease.Token != 2 {
			t.Fatalf("%+v", res.Handoff)
		}
	})
	t.Run("the waiter's ACL", func(t *testing.T) {
		a := newApplier(t)
		a.apply(setACL(false, rule("alice", "", permLease), rule("bob", "other/", permLease)))             // 1
		a.apply(acqWith(&wirepb.AcquireCmd{Resource: "r", Holder: "alice", TtlMs: 10, Identity: "alice"})) // 2
		c := waiterCmd("r", "bob", "b1")
		c.Identity = "bob"
		res := a.apply(&wirepb.Command{Op: &wirepb.Command_ReleaseHandoff{ReleaseHandoff: &wirepb.ReleaseHandoffCmd{
			Release: &wirepb.ReleaseCmd{Resource: "r", Token: 2, Identity: "alice"}, Acquire: c,
		}}})
		if res.Code != OK || res.Handoff == nil || res.Handoff.Code != Denied || len(res.Events) != 1 {
			t.Fatalf("%+v / %+v", res, res.Handoff)
		}
	})
	t.Run("request id reused with other parameters", func(t *testing.T) {
		a := newApplier(t)
		a.apply(acq("other", "bob", "b1")) // 1: bob's request id b1 names a grant of another resource
		a.apply(acq("r", "alice", "a1"))   // 2
		res := a.apply(handoff("r", 2, waiterCmd("r", "bob", "b1")))
		if res.Code != OK || res.Handoff == nil || res.Handoff.Code != RequestReused {
			t.Fatalf("%+v", res.Handoff)
		}
		if _, held := a.f.Get("r"); held {
			t.Fatal("granted under a reused request id")
		}
	})
}

// A semaphore slot's release hands that slot to the head waiter; the other slots are untouched and the
// limit holds.
func TestReleaseHandoffOfASemaphoreSlot(t *testing.T) {
	a := newApplier(t)
	slot := func(holder string) *wirepb.AcquireCmd {
		c := waiterCmd("sem", holder, holder+"-1")
		c.Limit = 2
		return c
	}
	a.apply(acqWith(slot("a"))) // 1
	a.apply(acqWith(slot("b"))) // 2
	if r := a.apply(acqWith(slot("c"))); r.Code != Held {
		t.Fatalf("third slot: %+v", r)
	}
	res := a.apply(handoff("sem", 1, slot("c"))) // 4
	if res.Code != OK || res.Handoff == nil || res.Handoff.Code != OK || res.Handoff.Lease.Token != 4 {
		t.Fatalf("%+v / %+v", res, res.Handoff)
	}
	slots := a.f.Slots("sem")
	if len(slots) != 2 || slots[0].Token != 2 || slots[1].Token != 4 {
		t.Fatalf("slots: %+v", slots)
	}
	// A handoff that does not free a slot (a stale token) leaves the semaphore full.
	if res := a.apply(handoff("sem", 1, slot("d"))); res.Handoff.Code != Held || len(a.f.Slots("sem")) != 2 {
		t.Fatalf("%+v", res.Handoff)
	}
}

// The combined entry is deterministic and snapshots like the two entries it replaces: the same log
// applied twice gives byte-identical snapshots, and a restored state answers a retry the same way.
func TestReleaseHandoffSnapshot(t *testing.T) {
	build := func() *FSM {
		a := newApplier(t)
		a.apply(acq("r", "alice", "a1"))
		a.apply(handoff("r", 1, waiterCmd("r", "bob", "b1")))
		a.apply(handoff("r", 2, waiterCmd("r", "carol", "c1")))
		return a.f
	}
	one, two := mustSnapshot(t, build()), mustSnapshot(t, build())
	if !bytes.Equal(one, two) {
		t.Fatal("snapshots differ")
	}
	f, err := Restore(one)
	if err != nil {
		t.Fatal(err)
	}
	if l, ok := f.Get("r"); !ok || l.Token != 3 || l.Holder != "carol" {
		t.Fatalf("restored: %+v", l)
	}
	if end := f.EndOf("r", 2); end.How != EndReleased || end.Index != 3 {
		t.Fatalf("end of bob's grant: %+v", end)
	}
}
