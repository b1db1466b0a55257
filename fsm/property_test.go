package fsm

import (
	"bytes"
	"fmt"
	"maps"
	"reflect"
	"testing"

	"pgregory.net/rapid"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
)

// genCommand draws commands over a small set of resources and holders so that conflicts, retries, stale
// tokens and lock-delays all happen often. Tokens are drawn near the current index so some are current.
func genCommand(next uint64) *rapid.Generator[*wirepb.Command] {
	resource := rapid.SampledFrom([]string{"a", "a/b", "b", "c", "db/1"})
	holder := rapid.SampledFrom([]string{"h1", "h2", "h3"})
	requestID := rapid.SampledFrom([]string{"", "q1", "q2"})
	token := rapid.Uint64Range(1, next+1)
	return rapid.Custom(func(t *rapid.T) *wirepb.Command {
		acquire := func() *wirepb.AcquireCmd {
			return &wirepb.AcquireCmd{
				Resource: resource.Draw(t, "resource"), Holder: holder.Draw(t, "holder"),
				TtlMs: 1000, RequestId: requestID.Draw(t, "request"),
				LockDelayMs: rapid.SampledFrom([]int64{0, 0, 500}).Draw(t, "delay"),
				HolderLimit: uint32(rapid.IntRange(0, 3).Draw(t, "limit")),
			}
		}
		switch rapid.IntRange(0, 7).Draw(t, "op") {
		case 0, 1:
			return acqWith(acquire())
		case 2:
			return rel(resource.Draw(t, "resource"), token.Draw(t, "token"))
		case 7: // a release carrying a waiter's acquire, usually of the same resource
			r := resource.Draw(t, "resource")
			a := acquire()
			if rapid.IntRange(0, 3).Draw(t, "same") > 0 {
				a.Resource = r
			}
			return handoff(r, token.Draw(t, "token"), a)
		case 3:
			n := rapid.IntRange(1, 3).Draw(t, "n")
			c := &wirepb.ExpireCmd{}
			for range n {
				c.Leases = append(c.Leases, &leasepb.LeaseRef{Resource: resource.Draw(t, "resource"), Token: token.Draw(t, "token")})
			}
			return &wirepb.Command{Op: &wirepb.Command_Expire{Expire: c}}
		case 4:
			return checkpoint(&wirepb.LeaseCheckpoint{Resource: resource.Draw(t, "resource"), Token: token.Draw(t, "token"),
				RemainingMs: rapid.Int64Range(0, 1000).Draw(t, "remaining"), Renewed: rapid.Bool().Draw(t, "renewed")})
		case 5:
			return &wirepb.Command{Op: &wirepb.Command_Renew{Renew: &wirepb.RenewCmd{Leases: []*leasepb.LeaseRef{
				{Resource: resource.Draw(t, "resource"), Token: token.Draw(t, "token")},
				{Resource: resource.Draw(t, "resource"), Token: token.Draw(t, "token")},
			}}}}
		default:
			return endDelay(resource.Draw(t, "resource"), int(token.Draw(t, "token")))
		}
	})
}

// invariantChecker checks I1 and I2 against the events seen so far, and checks every result against a
// small reference model of what the command should have done.
type invariantChecker struct {
	lastGrant map[string]uint64 // per resource, the last granted token
	highest   uint64
	live      map[string]uint64 // model of the live grants, built from events only
	model     map[string]*wirepb.AcquireCmd
	delayed   map[string]uint64 // resource -> expired token, while in lock-delay
	ended     map[uint64]End    // token -> how its lease ended (the runs are far below MaxRememberedEnds)
}

func newInvariantChecker() *invariantChecker {
	return &invariantChecker{lastGrant: map[string]uint64{}, live: map[string]uint64{},
		model: map[string]*wirepb.AcquireCmd{}, delayed: map[string]uint64{}, ended: map[uint64]End{}}
}

// sameRequest models decision 5: an acquire whose holder and request id name a live grant is answered
// by it: replayed if it repeats the grant's parameters, else refused as a reused request id.
func (c *invariantChecker) sameRequest(a *wirepb.AcquireCmd) (Code, bool) {
	if a.RequestId == "" {
		return 0, false
	}
	for _, l := range c.model {
		if l.Holder == a.Holder && l.RequestId == a.RequestId {
			if l.Resource == a.Resource && l.TtlMs == a.TtlMs && l.LockDelayMs == a.LockDelayMs {
				return OK, true
			}
			return RequestReused, true
		}
	}
	return 0, false
}

// expect predicts the result code and event count of cmd from the reference model, and updates the model.
func (c *invariantChecker) expect(index uint64, cmd *wirepb.Command) (Code, int) {
	switch op := cmd.Op.(type) {
	case *wirepb.Command_Acquire:
		a := op.Acquire
		if code, same := c.sameRequest(a); same {
			return code, 0
		}
		if cur, held := c.model[a.Resource]; held {
			if cur.Holder == a.Holder && a.RequestId != "" && cur.RequestId == a.RequestId {
				return OK, 0
			}
			return Held, 0
		}
		if _, d := c.delayed[a.Resource]; d {
			return LockDelayed, 0
		}
		count := 0
		for _, l := range c.model {
			if l.Holder == a.Holder {
				count++
			}
		}
		if a.HolderLimit > 0 && count >= int(a.HolderLimit) {
			return HolderLimit, 0
		}
		c.model[a.Resource] = a
		return OK, 1
	case *wirepb.Command_Release:
		r := op.Release
		if c.live[r.Resource] == r.Token && r.Token != 0 {
			delete(c.model, r.Resource)
			c.ended[r.Token] = End{Resource: r.Resource, Token: r.Token, How: EndReleased, Index: index}
			return OK, 1
		}
		if e, ok := c.ended[r.Token]; ok && e.Resource == r.Resource && e.How == EndReleased {
			return OK, 0 // a retry of a release that took effect
		}
		return NotCurrent, 0
	case *wirepb.Command_Expire:
		n := 0
		for _, ref := range op.Expire.Leases {
			if l, ok := c.model[ref.Resource]; ok && c.live[ref.Resource] == ref.Token {
				if l.LockDelayMs > 0 {
					c.delayed[ref.Resource] = ref.Token
				}
				delete(c.model, ref.Resource)
				delete(c.live, ref.Resource) // a duplicate ref in the same entry is ignored
				c.ended[ref.Token] = End{Resource: ref.Resource, Token: ref.Token, How: EndExpired, Index: index}
				n++
			}
		}
		return OK, n
	case *wirepb.Command_ReleaseHandoff:
		code, released := c.expect(index, &wirepb.Command{Op: &wirepb.Command_Release{Release: op.ReleaseHandoff.Release}})
		_, granted := c.expect(index, acqWith(op.ReleaseHandoff.Acquire))
		return code, released + granted
	case *wirepb.Command_Renew:
		return OK, 0
	case *wirepb.Command_EndLockDelay:
		for _, ref := range op.EndLockDelay.Delays {
			if c.delayed[ref.Resource] == ref.Token {
				delete(c.delayed, ref.Resource)
			}
		}
	}
	return OK, 0
}

func (c *invariantChecker) observe(t *rapid.T, index uint64, cmd *wirepb.Command, res Result) {
	live := maps.Clone(c.live)
	wantCode, wantEvents := c.expect(index, cmd)
	c.live = live // expect may have consumed expired refs; events rebuild the live model below
	if res.Code != wantCode || len(res.Events) != wantEvents {
		t.Fatalf("entry %d: got %v with %d events, model expects %v with %d", index, res.Code, len(res.Events), wantCode, wantEvents)
	}
	if r := cmd.GetRelease(); r != nil && len(res.Events) == 0 {
		want := End{Resource: r.Resource, Token: r.Token, How: EndNone}
		if e, ok := c.ended[r.Token]; ok && e.Resource == r.Resource {
			want = e
		}
		if res.End != want || res.Replayed != (want.How == EndReleased) {
			t.Fatalf("entry %d: release of a token not current says %+v (replayed %v), model says %+v", index, res.End, res.Replayed, want)
		}
	}
	for _, e := range res.Events {
		if e.Index != index {
			t.Fatalf("event index %d for entry %d", e.Index, index)
		}
		r := e.Lease.Resource
		switch e.Type {
		case leasepb.EventType_EVENT_TYPE_GRANTED:
			if e.Lease.Token != index || e.Lease.Token <= c.highest || e.Lease.Token <= c.lastGrant[r] {
				t.Fatalf("I1: grant of %q with token %d after highest %d / per-resource %d", r, e.Lease.Token, c.highest, c.lastGrant[r])
			}
			if _, held := c.live[r]; held {
				t.Fatalf("I2: %q granted at %d while token %d is live", r, index, c.live[r])
			}
			c.highest, c.lastGrant[r], c.live[r] = e.Lease.Token, e.Lease.Token, e.Lease.Token
		default:
			if c.live[r] != e.Lease.Token {
				t.Fatalf("%v of %q token %d, but live token is %d", e.Type, r, e.Lease.Token, c.live[r])
			}
			delete(c.live, r)
		}
	}
}

func (c *invariantChecker) compare(t *rapid.T, f *FSM) {
	got := map[string]uint64{}
	f.Ascend(func(l Lease) bool { got[l.Resource] = l.Token; return true })
	if !reflect.DeepEqual(got, c.live) && !(len(got) == 0 && len(c.live) == 0) {
		t.Fatalf("FSM state %v differs from the event model %v", got, c.live)
	}
	perHolder := 0
	for h := range f.holders {
		leases, _ := f.ListHolder(h, "", "", 0, 1<<20)
		if len(leases) != f.HolderCount(h) || len(leases) == 0 {
			t.Fatalf("holder %q: index has %d leases, count says %d", h, len(leases), f.HolderCount(h))
		}
		perHolder += len(leases)
	}
	if perHolder != f.Len() {
		t.Fatalf("holder index has %d leases, resource index %d", perHolder, f.Len())
	}
	if f.HighestToken() != c.highest {
		t.Fatalf("highest token %d, events say %d", f.HighestToken(), c.highest)
	}
}

// TestPropertyInvariantsAndSnapshotContinuation applies random command sequences and checks I1, I2, the
// holder index, determinism, and that snapshot -> restore -> continue equals applying straight through.
func TestPropertyInvariantsAndSnapshotContinuation(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 120).Draw(t, "n")
		cmds := make([]*wirepb.Command, n)
		for i := range cmds {
			cmds[i] = genCommand(uint64(i+1)).Draw(t, fmt.Sprintf("cmd%d", i))
		}
		split := rapid.IntRange(0, n).Draw(t, "split")

		straight, check := New(), newInvariantChecker()
		var straightResults []Result
		for i, c := range cmds {
			res, err := straight.Apply(uint64(i+1), c)
			if err != nil {
				t.Fatalf("apply %d: %v", i+1, err)
			}
			check.observe(t, uint64(i+1), c, res)
			check.compare(t, straight)
			straightResults = append(straightResults, res)
		}

		first := New()
		for i, c := range cmds[:split] {
			if _, err := first.Apply(uint64(i+1), c); err != nil {
				t.Fatal(err)
			}
		}
		snap, err := first.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		restored, err := Restore(snap)
		if err != nil {
			t.Fatalf("restore: %v", err)
		}
		if again, _ := restored.Snapshot(); !bytes.Equal(again, snap) {
			t.Fatalf("restore -> snapshot is not byte-identical")
		}
		for i := split; i < n; i++ {
			res, err := restored.Apply(uint64(i+1), cmds[i])
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(res, straightResults[i]) {
				t.Fatalf("entry %d: restored FSM answered %+v, straight %+v", i+1, res, straightResults[i])
			}
		}
		a, _ := straight.Snapshot()
		b, _ := restored.Snapshot()
		if !bytes.Equal(a, b) {
			t.Fatalf("snapshot after restore-and-continue differs from straight-through")
		}
	})
}
