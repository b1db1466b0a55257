package fsm

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
)

func TestAcquireGrantsFreeResourceWithTokenEqualToIndex(t *testing.T) {
	a := newApplier(t)
	a.apply(acq("other", "h0", "")) // index 1
	res := a.apply(acq("db/primary", "h1", "r1"))
	if res.Code != OK || res.Replayed {
		t.Fatalf("got %v replayed=%v, want a fresh grant", res.Code, res.Replayed)
	}
	if res.Lease.Token != 2 || res.Lease.Holder != "h1" || res.Lease.Resource != "db/primary" {
		t.Fatalf("grant = %+v, want token 2 to h1", res.Lease)
	}
	if !res.Lease.Renewed || res.Lease.Checkpointed {
		t.Fatalf("a fresh grant must count as renewed and not checkpointed: %+v", res.Lease)
	}
	if len(res.Events) != 1 || res.Events[0].Type != leasepb.EventType_EVENT_TYPE_GRANTED || res.Events[0].Index != 2 {
		t.Fatalf("events = %+v, want one GRANTED at 2", res.Events)
	}
	if a.f.HighestToken() != 2 || a.f.AppliedIndex() != 2 {
		t.Fatalf("highest=%d applied=%d, want 2 and 2", a.f.HighestToken(), a.f.AppliedIndex())
	}
}

func TestAcquireRetryWithSameRequestIDReturnsSameGrant(t *testing.T) {
	a := newApplier(t)
	first := a.apply(acq("r", "h1", "req-1"))
	retry := a.apply(acq("r", "h1", "req-1"))
	if retry.Code != OK || !retry.Replayed || retry.Lease.Token != first.Lease.Token {
		t.Fatalf("retry = %v replayed=%v token=%d, want the same grant %d", retry.Code, retry.Replayed, retry.Lease.Token, first.Lease.Token)
	}
	if len(retry.Events) != 0 {
		t.Fatalf("a replay must not emit events, got %+v", retry.Events)
	}
	if a.f.HighestToken() != first.Lease.Token {
		t.Fatalf("a replay must not issue a token")
	}
}

func TestAcquireRejections(t *testing.T) {
	tests := []struct {
		name  string
		setup []*wirepb.Command
		cmd   *wirepb.Command
		want  Code
	}{
		{"held by another holder", []*wirepb.Command{acq("r", "h1", "a")}, acq("r", "h2", "a"), Held},
		{"same holder, other request id", []*wirepb.Command{acq("r", "h1", "a")}, acq("r", "h1", "b"), Held},
		{"same holder, no request id", []*wirepb.Command{acq("r", "h1", "")}, acq("r", "h1", ""), Held},
		{"empty resource", nil, acq("", "h", ""), Invalid},
		{"empty holder", nil, acq("r", "", ""), Invalid},
		{"zero ttl", nil, acqWith(&wirepb.AcquireCmd{Resource: "r", Holder: "h"}), Invalid},
		{"negative lock delay", nil, acqWith(&wirepb.AcquireCmd{Resource: "r", Holder: "h", TtlMs: 1, LockDelayMs: -1}), Invalid},
		{"holder limit", []*wirepb.Command{acq("a", "h", ""), acq("b", "h", "")},
			acqWith(&wirepb.AcquireCmd{Resource: "c", Holder: "h", TtlMs: 1, HolderLimit: 2}), HolderLimit},
		{"lock delayed after expiry", []*wirepb.Command{
			acqWith(&wirepb.AcquireCmd{Resource: "r", Holder: "h1", TtlMs: 1, LockDelayMs: 5000}), expire("r", 1)},
			acq("r", "h2", ""), LockDelayed},
		{"unknown op is not a rejection but an error", nil, &wirepb.Command{}, Code(255)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newApplier(t)
			for _, c := range tt.setup {
				a.apply(c)
			}
			before := mustSnapshot(t, a.f)
			res, err := a.f.Apply(a.next, tt.cmd)
			if tt.want == Code(255) {
				if !errors.Is(err, ErrUnknownCommand) {
					t.Fatalf("err = %v, want ErrUnknownCommand", err)
				}
				if !bytes.Equal(before, mustSnapshot(t, a.f)) {
					t.Fatalf("an unknown command changed the state")
				}
				return
			}
			if err != nil || res.Code != tt.want {
				t.Fatalf("got %v (err %v), want %v", res.Code, err, tt.want)
			}
			if len(res.Events) != 0 {
				t.Fatalf("a rejection emitted events: %+v", res.Events)
			}
			after, err := a.f.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			// Only the applied index may move.
			f2, _ := Restore(before)
			_ = f2.Advance(a.next)
			if !bytes.Equal(mustSnapshot(t, f2), after) {
				t.Fatalf("a rejected acquire changed the state")
			}
		})
	}
}

func TestHeldResultNamesTheCurrentGrant(t *testing.T) {
	a := newApplier(t)
	a.apply(acq("r", "h1", "x"))
	res := a.apply(acq("r", "h2", "x"))
	if res.Lease.Holder != "h1" || res.Lease.Token != 1 {
		t.Fatalf("held result = %+v, want h1 with token 1", res.Lease)
	}
}

func TestReleaseOnlyWithCurrentToken(t *testing.T) {
	a := newApplier(t)
	a.apply(acq("r", "h1", ""))
	if res := a.apply(rel("r", 7)); res.Code != NotCurrent {
		t.Fatalf("release with a wrong token = %v, want NotCurrent", res.Code)
	}
	if res := a.apply(rel("missing", 1)); res.Code != NotCurrent {
		t.Fatalf("release of a free resource = %v, want NotCurrent", res.Code)
	}
	res := a.apply(rel("r", 1))
	if res.Code != OK || len(res.Events) != 1 || res.Events[0].Type != leasepb.EventType_EVENT_TYPE_RELEASED || res.Events[0].Index != 4 {
		t.Fatalf("release = %+v, want OK with one RELEASED event at 4", res)
	}
	if _, ok := a.f.Get("r"); ok {
		t.Fatalf("released resource still held")
	}
	if res := a.apply(rel("r", 1)); res.Code != OK || !res.Replayed || len(res.Events) != 0 {
		t.Fatalf("second release = %v replayed=%v events=%v, want OK, replayed, no event", res.Code, res.Replayed, res.Events)
	}
	// A voluntary release never starts a lock-delay.
	a.apply(acqWith(&wirepb.AcquireCmd{Resource: "d", Holder: "h", TtlMs: 1, LockDelayMs: 1000}))
	a.apply(rel("d", 6))
	if _, delayed := a.f.LockDelayOf("d"); delayed {
		t.Fatalf("release started a lock-delay")
	}
}

func TestReacquireAfterLossYieldsLargerToken(t *testing.T) {
	a := newApplier(t)
	t1 := a.apply(acq("r", "h1", "a")).Lease.Token
	a.apply(expire("r", int(t1)))
	t2 := a.apply(acq("r", "h1", "a")).Lease.Token
	if t2 <= t1 {
		t.Fatalf("token after loss %d is not larger than %d", t2, t1)
	}
}

func TestExpireIsIdempotentAndIgnoresStaleTokens(t *testing.T) {
	a := newApplier(t)
	a.apply(acq("a", "h", ""))                      // 1
	a.apply(acq("b", "h", ""))                      // 2
	a.apply(rel("b", 2))                            // 3
	a.apply(acq("b", "h2", ""))                     // 4
	res := a.apply(expire("a", 1, "b", 2, "zz", 9)) // 5: only a is current
	if len(res.Events) != 1 || res.Events[0].Lease.Resource != "a" || res.Events[0].Type != leasepb.EventType_EVENT_TYPE_EXPIRED {
		t.Fatalf("events = %+v, want one EXPIRED for a", res.Events)
	}
	if l, ok := a.f.Get("b"); !ok || l.Token != 4 {
		t.Fatalf("a stale expiry removed the newer grant of b")
	}
	if res := a.apply(expire("a", 1)); len(res.Events) != 0 {
		t.Fatalf("duplicate expiry emitted %+v", res.Events)
	}
}

func TestLockDelayEndsOnlyForItsExpiry(t *testing.T) {
	a := newApplier(t)
	a.apply(acqWith(&wirepb.AcquireCmd{Resource: "r", Holder: "h", TtlMs: 1, LockDelayMs: 3000})) // 1
	a.apply(expire("r", 1))                                                                       // 2
	d, ok := a.f.LockDelayOf("r")
	if !ok || d.Token != 1 || d.Index != 2 || d.DelayMs != 3000 {
		t.Fatalf("lock-delay = %+v %v, want token 1 index 2 3000ms", d, ok)
	}
	a.apply(endDelay("r", 99)) // names another expiry: ignored
	if _, ok := a.f.LockDelayOf("r"); !ok {
		t.Fatalf("EndLockDelay with a wrong token ended the delay")
	}
	a.apply(endDelay("r", 1))
	if _, ok := a.f.LockDelayOf("r"); ok {
		t.Fatalf("EndLockDelay did not end the delay")
	}
	if res := a.apply(acq("r", "h2", "")); res.Code != OK {
		t.Fatalf("acquire after the delay = %v, want OK", res.Code)
	}
}

func TestCheckpointAndRenew(t *testing.T) {
	a := newApplier(t)
	a.apply(acq("r", "h", "")) // 1
	a.apply(checkpoint(
		&wirepb.LeaseCheckpoint{Resource: "r", Token: 1, RemainingMs: 4000, Renewed: false},
		&wirepb.LeaseCheckpoint{Resource: "gone", Token: 3, RemainingMs: 1},
	))
	l, _ := a.f.Get("r")
	if !l.Checkpointed || l.Renewed || l.RemainingMs != 4000 {
		t.Fatalf("after checkpoint: %+v, want checkpointed idle 4000ms", l)
	}
	if res := a.apply(renew("r", 2)); res.Code != OK || len(res.Changes.Renewed) != 0 {
		t.Fatalf("renew with a wrong token = %+v, want OK and nothing renewed", res)
	}
	if l, _ := a.f.Get("r"); l.Renewed {
		t.Fatalf("a renewal with a wrong token renewed %+v", l)
	}
	if _, ok := a.f.Get("gone"); ok {
		t.Fatalf("a checkpoint created a lease")
	}
	// A Renew renews every current lease it names and ignores the others.
	res := a.apply(renew("r", 1, "gone", 3))
	if l, _ := a.f.Get("r"); res.Code != OK || !l.Renewed {
		t.Fatalf("renew = %v, lease %+v", res.Code, l)
	}
}

// TestResultSaysWhatChanged: a Result lists exactly what its command changed, with resource and token,
// and none of the command's stale references (the server's listeners consume nothing else).
func TestResultSaysWhatChanged(t *testing.T) {
	a := newApplier(t)
	a.apply(acq("a", "h", ""))                                                                  // 1
	a.apply(acqWith(&wirepb.AcquireCmd{Resource: "d", Holder: "h", TtlMs: 1, LockDelayMs: 50})) // 2
	res := a.apply(checkpoint(
		&wirepb.LeaseCheckpoint{Resource: "a", Token: 1, RemainingMs: 700, Renewed: true},
		&wirepb.LeaseCheckpoint{Resource: "a", Token: 9, RemainingMs: 1},
		&wirepb.LeaseCheckpoint{Resource: "d", Token: 2, RemainingMs: -5},
	)) // 3
	want := []Checkpoint{{Resource: "a", Token: 1, RemainingMs: 700, Renewed: true}, {Resource: "d", Token: 2, RemainingMs: 0}}
	if !slices.Equal(res.Changes.Checkpointed, want) {
		t.Fatalf("checkpointed = %+v, want %+v", res.Changes.Checkpointed, want)
	}
	if res := a.apply(renew("a", 1, "a", 2, "x", 1)); !slices.Equal(res.Changes.Renewed, []Ref{{"a", 1}}) { // 4
		t.Fatalf("renewed = %+v, want only a@1", res.Changes.Renewed)
	}
	res = a.apply(expire("a", 1, "d", 2, "d", 2)) // 5
	if len(res.Events) != 2 || !slices.Equal(res.Changes.DelaysStarted, []LockDelay{{Resource: "d", Token: 2, Index: 5, DelayMs: 50}}) {
		t.Fatalf("expire: events %+v, delays started %+v", res.Events, res.Changes.DelaysStarted)
	}
	if res := a.apply(endDelay("d", 1, "a", 1)); len(res.Changes.DelaysEnded) != 0 { // 6
		t.Fatalf("stale refs ended delays: %+v", res.Changes.DelaysEnded)
	}
	if res := a.apply(endDelay("d", 2)); !slices.Equal(res.Changes.DelaysEnded, []Ref{{"d", 2}}) { // 7
		t.Fatalf("delays ended = %+v, want d@2", res.Changes.DelaysEnded)
	}
	if res := a.apply(acq("a", "h", "")); !reflect.DeepEqual(res.Changes, Changes{}) { // 8
		t.Fatalf("a grant reported other changes: %+v", res.Changes)
	}
}

func TestApplyRejectsNonIncreasingIndex(t *testing.T) {
	f := New()
	if _, err := f.Apply(5, acq("r", "h", "")); err != nil {
		t.Fatal(err)
	}
	for _, idx := range []uint64{5, 4} {
		if _, err := f.Apply(idx, acq("s", "h", "")); !errors.Is(err, ErrIndexNotIncreasing) {
			t.Fatalf("apply at %d: err = %v, want ErrIndexNotIncreasing", idx, err)
		}
		if err := f.Advance(idx); !errors.Is(err, ErrIndexNotIncreasing) {
			t.Fatalf("advance to %d: err = %v", idx, err)
		}
	}
	if _, ok := f.Get("s"); ok {
		t.Fatalf("a rejected apply changed the state")
	}
}

func TestApplyEntryDecodes(t *testing.T) {
	data, err := EncodeCommand(acq("r", "h", "x"))
	if err != nil {
		t.Fatal(err)
	}
	f := New()
	res, err := f.ApplyEntry(1, data)
	if err != nil || res.Code != OK {
		t.Fatalf("ApplyEntry = %v, %v", res.Code, err)
	}
	if _, err := f.ApplyEntry(2, []byte{0xff, 0xff}); !errors.Is(err, ErrDecode) {
		t.Fatalf("garbage entry: err = %v, want ErrDecode", err)
	}
}

func TestListByPrefixPaginates(t *testing.T) {
	a := newApplier(t)
	for _, r := range []string{"a/1", "b/1", "b/2", "b/3", "b/4", "c"} {
		a.apply(acq(r, "h-"+r[:1], ""))
	}
	var got []string
	after := ""
	for page := 0; ; page++ {
		leases, more := a.f.List("b/", after, 0, 3)
		for _, l := range leases {
			got = append(got, l.Resource)
		}
		if !more {
			break
		}
		after = leases[len(leases)-1].Resource
		if page > 5 {
			t.Fatal("pagination does not end")
		}
	}
	if want := []string{"b/1", "b/2", "b/3", "b/4"}; !slices.Equal(got, want) {
		t.Fatalf("list b/ = %v, want %v", got, want)
	}
	all, more := a.f.List("", "", 0, 100)
	if len(all) != 6 || more {
		t.Fatalf("list all = %d more=%v", len(all), more)
	}
	if leases, more := a.f.List("b/", "b/4", 0, 10); len(leases) != 0 || more {
		t.Fatalf("list after the last = %v", leases)
	}
}

func TestListHolder(t *testing.T) {
	a := newApplier(t)
	a.apply(acq("x", "alice", ""))
	a.apply(acq("a", "bob", ""))
	a.apply(acq("b", "alice", ""))
	a.apply(acq("c", "alice", ""))
	page, more := a.f.ListHolder("alice", "", "", 0, 2)
	if len(page) != 2 || !more || page[0].Resource != "b" || page[1].Resource != "c" {
		t.Fatalf("first page = %+v more=%v", page, more)
	}
	page, more = a.f.ListHolder("alice", "", "c", 0, 2)
	if len(page) != 1 || more || page[0].Resource != "x" {
		t.Fatalf("second page = %+v more=%v", page, more)
	}
	if a.f.HolderCount("alice") != 3 || a.f.HolderCount("nobody") != 0 {
		t.Fatalf("holder counts wrong")
	}
}

// A holder's listing filters by prefix while it scans, so a page of non-matching leases can neither come
// back empty nor end the listing early (it used to: the prefix was applied after the page was cut).
func TestListHolderFiltersPrefixBeforePaging(t *testing.T) {
	a := newApplier(t)
	for i := range 1100 {
		a.apply(acq(fmt.Sprintf("a/%04d", i), "h", ""))
	}
	for i := range 3 {
		a.apply(acq(fmt.Sprintf("b/%d", i), "h", ""))
	}
	a.apply(acq("b/other", "someone-else", ""))
	page, more := a.f.ListHolder("h", "b/", "", 0, 100)
	if len(page) != 3 || more {
		t.Fatalf("holder h under b/ = %d leases (more=%v), want 3", len(page), more)
	}
	for i, l := range page {
		if l.Resource != fmt.Sprintf("b/%d", i) || l.Holder != "h" {
			t.Fatalf("lease %d = %+v", i, l)
		}
	}

	// Paging with a small limit over a mixed set returns every match exactly once, in order.
	for _, prefix := range []string{"", "a/", "a/00", "b/", "c/"} {
		seen := map[string]int{}
		var order []string
		after := ""
		for pages := 0; ; pages++ {
			if pages > 200 {
				t.Fatalf("prefix %q: paging does not end", prefix)
			}
			page, more := a.f.ListHolder("h", prefix, after, 0, 10)
			for _, l := range page {
				seen[l.Resource]++
				order = append(order, l.Resource)
			}
			if !more {
				break
			}
			if len(page) == 0 {
				t.Fatalf("prefix %q: an empty page says more follow", prefix)
			}
			after = page[len(page)-1].Resource
		}
		want := 0
		a.f.Ascend(func(l Lease) bool {
			if l.Holder == "h" && strings.HasPrefix(l.Resource, prefix) {
				want++
				if seen[l.Resource] != 1 {
					t.Fatalf("prefix %q: %s listed %d times", prefix, l.Resource, seen[l.Resource])
				}
			}
			return true
		})
		if len(order) != want || !slices.IsSorted(order) {
			t.Fatalf("prefix %q: listed %d (sorted=%v), want %d", prefix, len(order), slices.IsSorted(order), want)
		}
	}
}
