package fsm

import (
	"bytes"
	"reflect"
	"testing"

	"pgregory.net/rapid"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
)

// genRefusable draws acquires over few resources, holders, request ids and attempts, with and without
// identities, limits and waiting, so that HeldRefusal meets every kind of refusal the apply makes.
func genRefusable() *rapid.Generator[*wirepb.AcquireCmd] {
	return rapid.Custom(func(t *rapid.T) *wirepb.AcquireCmd {
		return &wirepb.AcquireCmd{
			Resource:           rapid.SampledFrom([]string{"a", "b", "denied/x"}).Draw(t, "resource"),
			Holder:             rapid.SampledFrom([]string{"h1", "h2"}).Draw(t, "holder"),
			TtlMs:              1000,
			RequestId:          rapid.SampledFrom([]string{"", "q1", "q2"}).Draw(t, "request"),
			Identity:           rapid.SampledFrom([]string{"", "alice", "bob"}).Draw(t, "identity"),
			LockDelayMs:        rapid.SampledFrom([]int64{0, 500}).Draw(t, "delay"),
			Limit:              uint32(rapid.SampledFrom([]int{0, 0, 0, 2}).Draw(t, "limit")),
			HolderLimit:        uint32(rapid.IntRange(0, 2).Draw(t, "holderLimit")),
			Attempt:            uint32(rapid.IntRange(0, 3).Draw(t, "attempt")),
			Wait:               rapid.Bool().Draw(t, "wait"),
			CheckRequestParams: rapid.Bool().Draw(t, "check"),
		}
	})
}

// TestPropertyHeldRefusalIsWhatTheApplyAnswers: whenever HeldRefusal answers, applying the command
// answers exactly that; it changes nothing itself; and for a plain lease it misses no Held refusal that
// is not a stale attempt's or a retry's. A server answers a fresh request id's refusal from it without a
// log entry, so a difference would be an answer no entry backs.
func TestPropertyHeldRefusalIsWhatTheApplyAnswers(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		f := New()
		// alice may lease a and b (not denied/x), bob nothing.
		if _, err := f.Apply(1, setACL(true, rule("alice", "a", leasepb.Permission_PERMISSION_LEASE),
			rule("alice", "b", leasepb.Permission_PERMISSION_LEASE))); err != nil {
			t.Fatal(err)
		}
		var tokens []uint64
		n := rapid.IntRange(1, 80).Draw(t, "n")
		for i := range n {
			index := uint64(i + 2)
			var cmd *wirepb.Command
			switch rapid.IntRange(0, 5).Draw(t, "op") {
			case 0:
				if len(tokens) > 0 {
					tok := rapid.SampledFrom(tokens).Draw(t, "token")
					cmd = rel(rapid.SampledFrom([]string{"a", "b", "denied/x"}).Draw(t, "resource"), tok)
					break
				}
				fallthrough
			case 1:
				if len(tokens) > 0 {
					tok := rapid.SampledFrom(tokens).Draw(t, "token")
					cmd = expire(rapid.SampledFrom([]string{"a", "b", "denied/x"}).Draw(t, "resource"), int(tok))
					break
				}
				fallthrough
			default:
				cmd = acqWith(genRefusable().Draw(t, "acquire"))
			}
			var predicted Result
			var answered bool
			if a := cmd.GetAcquire(); a != nil {
				before, _ := f.Snapshot()
				predicted, answered = f.HeldRefusal(a)
				if after, _ := f.Snapshot(); !bytes.Equal(before, after) {
					t.Fatalf("entry %d: HeldRefusal changed the state", index)
				}
			}
			res, err := f.Apply(index, cmd)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range res.Events {
				if e.Type == leasepb.EventType_EVENT_TYPE_GRANTED {
					tokens = append(tokens, e.Lease.Token)
				}
			}
			a := cmd.GetAcquire()
			if a == nil {
				continue
			}
			if answered && !reflect.DeepEqual(predicted, res) {
				t.Fatalf("entry %d %v: HeldRefusal said %+v, the apply %+v", index, a, predicted, res)
			}
			if !answered && res.Code == Held && a.GetLimit() == 0 && !res.Replayed {
				t.Fatalf("entry %d %v: the apply refused it as held, HeldRefusal did not say so", index, a)
			}
		}
	})
}
