package fsm

import (
	"fmt"
	"testing"

	"github.com/leased/leased/api/wirepb"
)

// acqAs is an acquire of resource by holder as identity, with the limits a proposer of this version sets.
func acqLimited(identity, holder, resource string, holderLimit, identityLimit uint32) *wirepb.Command {
	return acqWith(&wirepb.AcquireCmd{Resource: resource, Holder: holder, TtlMs: 10_000, Identity: identity,
		HolderLimit: holderLimit, IdentityLimit: identityLimit, HolderLimitPerIdentity: identity != "", CheckRequestParams: true})
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
