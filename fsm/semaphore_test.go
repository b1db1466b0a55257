package fsm

import (
	"bytes"
	"fmt"
	"reflect"
	"testing"

	"google.golang.org/protobuf/proto"
	"pgregory.net/rapid"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
)

func slot(resource, holder string, limit uint32, requestID string) *wirepb.Command {
	return acqWith(&wirepb.AcquireCmd{Resource: resource, Holder: holder, TtlMs: 10_000, Limit: limit,
		RequestId: requestID})
}

func proclaimCmd(resource string, token uint64, value string) *wirepb.Command {
	return &wirepb.Command{Op: &wirepb.Command_Proclaim{Proclaim: &wirepb.ProclaimCmd{Resource: resource, Token: token, Value: []byte(value)}}}
}

func TestSemaphoreGrantsAtMostLimitSlots(t *testing.T) {
	a := newApplier(t)
	var tokens []uint64
	for i := range 3 {
		res := a.apply(slot("jobs/s", fmt.Sprintf("h%d", i), 3, ""))
		if res.Code != OK || res.Lease.Limit != 3 {
			t.Fatalf("slot %d: %v %+v", i, res.Code, res.Lease)
		}
		tokens = append(tokens, res.Lease.Token)
	}
	if res := a.apply(slot("jobs/s", "h9", 3, "")); res.Code != Held || res.Lease.Token != tokens[0] {
		t.Fatalf("a fourth slot of three: %v, lease %+v (want held, naming the oldest slot %d)", res.Code, res.Lease, tokens[0])
	}
	slots := a.f.Slots("jobs/s")
	if len(slots) != 3 {
		t.Fatalf("Slots: %d, want 3", len(slots))
	}
	for i, s := range slots {
		if s.Token != tokens[i] || !a.f.IsCurrent("jobs/s", s.Token) {
			t.Fatalf("slot %d: token %d, want %d and current", i, s.Token, tokens[i])
		}
	}
	if l, _ := a.f.Get("jobs/s"); l.Token != tokens[0] {
		t.Fatalf("Get of a semaphore: token %d, want the oldest slot %d", l.Token, tokens[0])
	}
	// A release and an expiry each free one slot; the next grants get new, larger tokens.
	if res := a.apply(rel("jobs/s", tokens[1])); res.Code != OK || len(res.Events) != 1 {
		t.Fatalf("release of a slot: %+v", res)
	}
	if res := a.apply(expire("jobs/s", int(tokens[0]))); len(res.Events) != 1 {
		t.Fatalf("expiry of a slot: %+v", res)
	}
	for range 2 {
		res := a.apply(slot("jobs/s", "h9", 3, ""))
		if res.Code != OK || res.Lease.Token <= tokens[len(tokens)-1] {
			t.Fatalf("slot after a free: %v token %d after %v", res.Code, res.Lease.Token, tokens)
		}
		tokens = append(tokens, res.Lease.Token)
	}
	if res := a.apply(slot("jobs/s", "h9", 3, "")); res.Code != Held {
		t.Fatalf("full again: %v", res.Code)
	}
	// Once every slot ended, the resource is free for another limit, or for a plain lease.
	for _, s := range a.f.Slots("jobs/s") {
		a.apply(rel("jobs/s", s.Token))
	}
	if _, ok := a.f.SemaphoreLimit("jobs/s"); ok || a.f.Len() != 0 {
		t.Fatalf("semaphore should be gone: %d leases", a.f.Len())
	}
	if res := a.apply(acq("jobs/s", "h1", "")); res.Code != OK {
		t.Fatalf("plain lease on a freed semaphore: %v", res.Code)
	}
}

func TestSemaphoreLimitMismatch(t *testing.T) {
	a := newApplier(t)
	a.apply(slot("s", "h1", 2, ""))
	for _, c := range []struct {
		name string
		cmd  *wirepb.Command
	}{
		{"another limit", slot("s", "h2", 3, "")},
		{"a plain lease", acq("s", "h2", "")},
	} {
		if res := a.apply(c.cmd); res.Code != LimitMismatch || res.Lease.Limit != 2 {
			t.Fatalf("%s on a semaphore of 2: %v limit %d", c.name, res.Code, res.Lease.Limit)
		}
	}
	a.apply(acq("p", "h1", ""))
	if res := a.apply(slot("p", "h2", 2, "")); res.Code != LimitMismatch || res.Lease.Limit != 0 {
		t.Fatalf("a slot on a plain lease: %v limit %d", res.Code, res.Lease.Limit)
	}
	if got := len(a.f.Slots("s")); got != 1 || a.f.Len() != 2 {
		t.Fatalf("a refused acquire changed the state: %d slots, %d leases", got, a.f.Len())
	}
}

func TestSemaphoreRequestIDReplaysItsSlot(t *testing.T) {
	a := newApplier(t)
	first := a.apply(slot("s", "h1", 2, "q"))
	again := a.apply(slot("s", "h1", 2, "q"))
	if again.Code != OK || !again.Replayed || again.Lease.Token != first.Lease.Token || len(a.f.Slots("s")) != 1 {
		t.Fatalf("retry: %+v, %d slots", again, len(a.f.Slots("s")))
	}
	if res := a.apply(slot("s", "h1", 3, "q")); res.Code != RequestReused || res.Reuse.Field != "limit" {
		t.Fatalf("request id reused with another limit: %v %+v", res.Code, res.Reuse)
	}
}

func TestProclaimKeepsTheTokenAndChangesTheValue(t *testing.T) {
	a := newApplier(t)
	g := a.apply(acqWith(&wirepb.AcquireCmd{Resource: "svc/leader", Holder: "n1", TtlMs: 10_000, Value: []byte("10.0.0.1"), RequestId: "q"}))
	res := a.apply(proclaimCmd("svc/leader", g.Lease.Token, "10.0.0.2"))
	if res.Code != OK || res.Lease.Token != g.Lease.Token || string(res.Lease.Value) != "10.0.0.2" {
		t.Fatalf("proclaim: %v %+v", res.Code, res.Lease)
	}
	if len(res.Events) != 1 || res.Events[0].Type != leasepb.EventType_EVENT_TYPE_VALUE_CHANGED {
		t.Fatalf("proclaim events: %+v", res.Events)
	}
	if l, _ := a.f.Get("svc/leader"); string(l.Value) != "10.0.0.2" || l.Token != g.Lease.Token {
		t.Fatalf("after proclaim: %+v", l)
	}
	// The grant's own retry still replays (its value is no longer compared once proclaimed).
	if r := a.apply(acqWith(&wirepb.AcquireCmd{Resource: "svc/leader", Holder: "n1", TtlMs: 10_000, Value: []byte("10.0.0.1"), RequestId: "q"})); !r.Replayed {
		t.Fatalf("retry after proclaim: %v %+v", r.Code, r.Reuse)
	}
	if r := a.apply(proclaimCmd("svc/leader", g.Lease.Token+100, "x")); r.Code != NotCurrent {
		t.Fatalf("proclaim with a stale token: %v", r.Code)
	}
	a.apply(rel("svc/leader", g.Lease.Token))
	if r := a.apply(proclaimCmd("svc/leader", g.Lease.Token, "x")); r.Code != NotCurrent || r.End.How != EndReleased {
		t.Fatalf("proclaim after release: %v %+v", r.Code, r.End)
	}
	// A semaphore slot can be proclaimed too.
	s := a.apply(slot("s", "h", 2, ""))
	if r := a.apply(proclaimCmd("s", s.Lease.Token, "v")); r.Code != OK || string(a.f.Slots("s")[0].Value) != "v" {
		t.Fatalf("proclaim of a slot: %v", r.Code)
	}
}

func TestSemaphoreSnapshotAndList(t *testing.T) {
	a := newApplier(t)
	a.apply(acq("a", "h", ""))
	for range 3 {
		a.apply(slot("b", "h", 4, ""))
	}
	a.apply(acq("c", "h", ""))
	a.apply(proclaimCmd("b", 2, "v"))
	snap := mustSnapshot(t, a.f)
	r, err := Restore(snap)
	if err != nil {
		t.Fatal(err)
	}
	if again := mustSnapshot(t, r); !bytes.Equal(again, snap) {
		t.Fatal("restore -> snapshot is not byte-identical")
	}
	if lim, ok := r.SemaphoreLimit("b"); !ok || lim != 4 || len(r.Slots("b")) != 3 {
		t.Fatalf("restored semaphore: limit %d %v, %d slots", lim, ok, len(r.Slots("b")))
	}
	// Paging two at a time walks every lease once, slots in token order.
	var seen []string
	after, afterSlot := "", uint64(0)
	for {
		page, more := r.List("", after, afterSlot, 2)
		for _, l := range page {
			seen = append(seen, fmt.Sprintf("%s/%d", l.Resource, l.Token))
		}
		if !more {
			break
		}
		last := page[len(page)-1]
		after, afterSlot = last.Resource, 0
		if last.Limit > 0 {
			afterSlot = last.Token
		}
	}
	if want := []string{"a/1", "b/2", "b/3", "b/4", "c/5"}; !reflect.DeepEqual(seen, want) {
		t.Fatalf("paged list %v, want %v", seen, want)
	}
	if page, _ := r.ListHolder("h", "", "b", 3, 10); len(page) != 2 || page[0].Token != 4 {
		t.Fatalf("ListHolder after slot b/3: %+v", page)
	}
}

// TestSnapshotRefusesTooManySlots: a snapshot whose semaphore has more slots than its limit is refused.
func TestSnapshotRefusesTooManySlots(t *testing.T) {
	a := newApplier(t)
	for range 2 {
		a.apply(slot("b", "h", 2, ""))
	}
	body := &wirepb.SnapshotBody{AppliedIndex: 3, HighestToken: 3, ForgottenThrough: proto.Uint64(0), Leases: []*wirepb.LeaseRecord{
		{Resource: "b", Holder: "h", Token: 1, TtlMs: 1, Limit: 2},
		{Resource: "b", Holder: "h", Token: 2, TtlMs: 1, Limit: 2},
		{Resource: "b", Holder: "h", Token: 3, TtlMs: 1, Limit: 2},
	}}
	if _, err := Restore(sealed(t, body)); err == nil {
		t.Fatal("three slots of a semaphore of two restored")
	}
	body.Leases = body.Leases[:2]
	body.Leases[1].Limit = 3
	if _, err := Restore(sealed(t, body)); err == nil {
		t.Fatal("slots disagreeing on the limit restored")
	}
}

// TestPropertySemaphoreNeverGrantsMoreThanLimit applies random slot acquires (with limits that sometimes
// disagree), releases, expiries and proclaims, and checks after every entry: at most limit live slots per
// resource, each grant's token larger than every earlier one, the FSM's slots equal to the model built
// from events, and that a snapshot restores to the same state.
func TestPropertySemaphoreNeverGrantsMoreThanLimit(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		resource := rapid.SampledFrom([]string{"s1", "s2"})
		f := New()
		live := map[string]map[uint64]bool{}
		limit := map[string]uint32{}
		var highest uint64
		n := rapid.IntRange(1, 150).Draw(t, "n")
		for i := uint64(1); i <= uint64(n); i++ {
			r := resource.Draw(t, "resource")
			var cmd *wirepb.Command
			switch rapid.IntRange(0, 5).Draw(t, "op") {
			case 0, 1, 2:
				lim := rapid.SampledFrom([]uint32{2, 2, 2, 3}).Draw(t, "limit")
				cmd = slot(r, rapid.SampledFrom([]string{"h1", "h2"}).Draw(t, "holder"), lim,
					rapid.SampledFrom([]string{"", "q1", "q2"}).Draw(t, "request"))
			case 3:
				cmd = rel(r, rapid.Uint64Range(1, i).Draw(t, "token"))
			case 4:
				cmd = expire(r, int(rapid.Uint64Range(1, i).Draw(t, "token")))
			default:
				cmd = proclaimCmd(r, rapid.Uint64Range(1, i).Draw(t, "token"), "v")
			}
			res, err := f.Apply(i, cmd)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range res.Events {
				r, tok := e.Lease.Resource, e.Lease.Token
				switch e.Type {
				case leasepb.EventType_EVENT_TYPE_GRANTED:
					if tok != i || tok <= highest {
						t.Fatalf("grant token %d at index %d after highest %d", tok, i, highest)
					}
					highest = tok
					if len(live[r]) == 0 {
						live[r], limit[r] = map[uint64]bool{}, e.Lease.Limit
					}
					if e.Lease.Limit != limit[r] {
						t.Fatalf("%q granted a slot of limit %d while its slots have %d", r, e.Lease.Limit, limit[r])
					}
					live[r][tok] = true
					if len(live[r]) > int(limit[r]) {
						t.Fatalf("%q has %d live slots, limit %d", r, len(live[r]), limit[r])
					}
				case leasepb.EventType_EVENT_TYPE_RELEASED, leasepb.EventType_EVENT_TYPE_EXPIRED:
					if !live[r][tok] {
						t.Fatalf("%v of %q token %d, which is not live", e.Type, r, tok)
					}
					delete(live[r], tok)
				}
			}
			for _, r := range []string{"s1", "s2"} {
				slots := f.Slots(r)
				if len(slots) != len(live[r]) {
					t.Fatalf("%q: FSM has %d slots, events say %d", r, len(slots), len(live[r]))
				}
				for j, s := range slots {
					if !live[r][s.Token] || (j > 0 && s.Token <= slots[j-1].Token) {
						t.Fatalf("%q: slots %+v disagree with the model", r, slots)
					}
				}
			}
		}
		snap, err := f.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		restored, err := Restore(snap)
		if err != nil {
			t.Fatalf("restore: %v", err)
		}
		if again, _ := restored.Snapshot(); !bytes.Equal(again, snap) {
			t.Fatal("restore -> snapshot is not byte-identical")
		}
	})
}
