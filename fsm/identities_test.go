package fsm

import (
	"fmt"
	"reflect"
	"testing"

	"pgregory.net/rapid"

	"github.com/leased/leased/api/wirepb"
)

// acqAs is an acquire of resource by holder as identity, with the limits a proposer of this version sets.
func acqLimited(identity, holder, resource string, holderLimit, identityLimit uint32) *wirepb.Command {
	return acqWith(&wirepb.AcquireCmd{Resource: resource, Holder: holder, TtlMs: 10_000, Identity: identity,
		HolderLimit: holderLimit, IdentityLimit: identityLimit, HolderLimitPerIdentity: identity != ""})
}

// identityApplier is an applier whose ACL lets alice and bob lease anything.
func identityApplier(t *testing.T) *applier {
	a := newApplier(t)
	a.apply(setACL(false, rule("alice", "", permLease), rule("bob", "", permLease)))
	return a
}

// TestHolderLimitCountsWithinIdentity: an identity that uses another's holder label cannot use up the
// other's per-holder allowance, for plain leases and semaphore slots alike.
func TestHolderLimitCountsWithinIdentity(t *testing.T) {
	a := identityApplier(t)
	for i := range 2 {
		if res := a.apply(acqLimited("bob", "worker", fmt.Sprint("bob/", i), 2, 0)); res.Code != OK {
			t.Fatalf("bob's grant %d: %v", i, res.Code)
		}
	}
	if res := a.apply(acqLimited("bob", "worker", "bob/2", 2, 0)); res.Code != HolderLimit {
		t.Fatalf("bob's third lease under his label at limit 2: %v, want holder-limit", res.Code)
	}
	if res := a.apply(acqLimited("alice", "worker", "alice/0", 2, 0)); res.Code != OK {
		t.Fatalf("alice under the label bob filled: %v, want ok (her allowance is her own)", res.Code)
	}
	slot := acqLimited("alice", "worker", "sem", 2, 0)
	slot.GetAcquire().Limit = 3
	if res := a.apply(slot); res.Code != OK {
		t.Fatalf("alice's semaphore slot: %v", res.Code)
	}
	if res := a.apply(acqLimited("alice", "worker", "alice/2", 2, 0)); res.Code != HolderLimit {
		t.Fatalf("alice's third lease under her label: %v, want holder-limit", res.Code)
	}
	if got := a.f.HolderCount("worker"); got != 4 {
		t.Fatalf("the label holds %d leases in all, want 4", got)
	}
}

// TestHolderLimitOldEntries: an entry without holder_limit_per_identity (an earlier version's) counts
// the holder's leases of every identity, as it did when it was first applied.
func TestHolderLimitOldEntries(t *testing.T) {
	a := identityApplier(t)
	a.apply(acqLimited("bob", "worker", "bob/0", 1, 0))
	old := acqLimited("alice", "worker", "alice/0", 1, 0)
	old.GetAcquire().HolderLimitPerIdentity = false
	if res := a.apply(old); res.Code != HolderLimit {
		t.Fatalf("an old entry: %v, want holder-limit as it applied then", res.Code)
	}
}

// TestIdentityLimit: an identity at identity_limit is refused under any holder label, another identity
// and unauthenticated commands are not, and a release makes room again; the counts survive a snapshot.
func TestIdentityLimit(t *testing.T) {
	a := identityApplier(t) // index 1; bob's grants take 2, 3, 4
	for i := range 3 {
		if res := a.apply(acqLimited("bob", fmt.Sprint("h", i), fmt.Sprint("bob/", i), 0, 3)); res.Code != OK {
			t.Fatalf("bob's grant %d: %v", i, res.Code)
		}
	}
	if res := a.apply(acqLimited("bob", "fresh-label", "bob/3", 0, 3)); res.Code != IdentityLimit {
		t.Fatalf("bob's fourth lease at limit 3 under a new label: %v, want identity-limit", res.Code)
	}
	slot := acqLimited("bob", "h0", "sem", 0, 3)
	slot.GetAcquire().Limit = 2
	if res := a.apply(slot); res.Code != IdentityLimit {
		t.Fatalf("bob's semaphore slot at his limit: %v, want identity-limit", res.Code)
	}
	if res := a.apply(acqLimited("alice", "h0", "alice/0", 0, 3)); res.Code != OK {
		t.Fatalf("alice while bob is at his limit: %v", res.Code)
	}
	if res := a.apply(acqLimited("", "h0", "anon/0", 0, 0)); res.Code != OK {
		t.Fatalf("a command without identity: %v", res.Code)
	}
	if got := a.f.IdentityCount("bob"); got != 3 {
		t.Fatalf("bob holds %d, want 3", got)
	}

	restored, err := Restore(mustSnapshot(t, a.f))
	if err != nil {
		t.Fatal(err)
	}
	if restored.IdentityCount("bob") != 3 || restored.IdentityCount("alice") != 1 {
		t.Fatalf("after a restore bob holds %d, alice %d; want 3 and 1", restored.IdentityCount("bob"), restored.IdentityCount("alice"))
	}
	a.f = restored
	if res := a.apply(acqLimited("bob", "h9", "bob/3", 0, 3)); res.Code != IdentityLimit {
		t.Fatalf("bob after a restore: %v, want identity-limit", res.Code)
	}
	if res := a.apply(rel("bob/0", 2)); res.Code != OK {
		t.Fatalf("release: %v", res.Code)
	}
	if res := a.apply(acqLimited("bob", "h9", "bob/3", 0, 3)); res.Code != OK {
		t.Fatalf("bob after a release: %v, want ok", res.Code)
	}
	if res := a.apply(expire("bob/1", 3, "bob/2", 4)); len(res.Events) != 2 {
		t.Fatalf("expire: %d events", len(res.Events))
	}
	if got := a.f.IdentityCount("bob"); got != 1 {
		t.Fatalf("bob holds %d after a release and two expiries, want 1", got)
	}
}

// recount counts the live leases of every identity, in all and by holder label, from the leases.
func recount(f *FSM) map[string]*identityUse {
	out := map[string]*identityUse{}
	f.Ascend(func(l Lease) bool {
		if l.Identity == "" {
			return true
		}
		u := out[l.Identity]
		if u == nil {
			u = &identityUse{holders: map[string]int{}}
			out[l.Identity] = u
		}
		u.leases++
		u.holders[l.Holder]++
		return true
	})
	return out
}

// TestPropertyIdentityCounts applies random acquires (plain and slots, with and without identities and
// limits), releases, expiries and handoffs, with a snapshot restore somewhere in between, and checks
// after every entry that the identity counts equal a recount from the leases, and that every grant and
// limit refusal agrees with the counts before the entry.
func TestPropertyIdentityCounts(t *testing.T) {
	resources := []string{"a", "b", "c", "d"}
	rapid.Check(t, func(t *rapid.T) {
		f := New()
		if _, err := f.Apply(1, setACL(false, rule("alice", "", permLease, permAdmin), rule("bob", "", permLease))); err != nil {
			t.Fatal(err)
		}
		var tokens []uint64
		n := rapid.IntRange(1, 100).Draw(t, "n")
		restoreAt := rapid.IntRange(0, n).Draw(t, "restoreAt")
		for i := range n {
			index := uint64(i + 2)
			if i == restoreAt {
				snap, err := f.Snapshot()
				if err != nil {
					t.Fatal(err)
				}
				restored, err := Restore(snap)
				if err != nil {
					t.Fatal(err)
				}
				f = restored
			}
			a := &wirepb.AcquireCmd{
				Resource: rapid.SampledFrom(resources).Draw(t, "resource"), Holder: rapid.SampledFrom([]string{"h1", "h2"}).Draw(t, "holder"),
				TtlMs: 1000, Identity: rapid.SampledFrom([]string{"", "alice", "bob"}).Draw(t, "identity"),
				Limit:                  uint32(rapid.SampledFrom([]int{0, 0, 3}).Draw(t, "limit")),
				HolderLimit:            uint32(rapid.IntRange(0, 3).Draw(t, "holderLimit")),
				IdentityLimit:          uint32(rapid.IntRange(0, 3).Draw(t, "identityLimit")),
				HolderLimitPerIdentity: rapid.Bool().Draw(t, "perIdentity"),
			}
			var cmd *wirepb.Command
			switch op := rapid.IntRange(0, 4).Draw(t, "op"); {
			case op <= 1 || len(tokens) == 0:
				cmd = acqWith(a)
			case op == 2:
				tok := rapid.SampledFrom(tokens).Draw(t, "token")
				r := rel(rapid.SampledFrom(resources).Draw(t, "resource"), tok)
				r.GetRelease().Identity = rapid.SampledFrom([]string{"", "alice"}).Draw(t, "releaser")
				cmd = r
			case op == 3:
				cmd = expire(rapid.SampledFrom(resources).Draw(t, "resource"), int(rapid.SampledFrom(tokens).Draw(t, "token")))
			default:
				cmd = handoff(rapid.SampledFrom(resources).Draw(t, "resource"), rapid.SampledFrom(tokens).Draw(t, "token"), a)
			}
			before := recount(f)
			holderAll := f.HolderCount(a.Holder)
			res, err := f.Apply(index, cmd)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := f.identities, recount(f); !reflect.DeepEqual(got, want) && !(len(got) == 0 && len(want) == 0) {
				t.Fatalf("entry %d: identity counts %v, the leases say %v", index, dump(got), dump(want))
			}
			if cmd.GetAcquire() == nil {
				continue
			}
			u := before[a.Identity]
			if u == nil {
				u = &identityUse{holders: map[string]int{}}
			}
			holderCount := holderAll
			if a.HolderLimitPerIdentity && a.Identity != "" {
				holderCount = u.holders[a.Holder]
			}
			overHolder := a.HolderLimit > 0 && holderCount >= int(a.HolderLimit)
			overIdentity := a.Identity != "" && a.IdentityLimit > 0 && u.leases >= int(a.IdentityLimit)
			granted := len(res.Events) > 0
			switch {
			case granted && (overHolder || overIdentity):
				t.Fatalf("entry %d: %+v granted past a limit (holder count %d, identity count %d)", index, a, holderCount, u.leases)
			case res.Code == HolderLimit && !overHolder, res.Code == IdentityLimit && (!overIdentity || overHolder):
				t.Fatalf("entry %d: %+v refused %v (holder count %d, identity count %d)", index, a, res.Code, holderCount, u.leases)
			}
			if granted {
				tokens = append(tokens, index)
			}
		}
	})
}

func dump(m map[string]*identityUse) map[string]identityUse {
	out := map[string]identityUse{}
	for k, v := range m {
		out[k] = *v
	}
	return out
}
