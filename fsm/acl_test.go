package fsm

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
)

const (
	permRead  = leasepb.Permission_PERMISSION_READ
	permLease = leasepb.Permission_PERMISSION_LEASE
	permAdmin = leasepb.Permission_PERMISSION_ADMIN
)

// acqAs is an Acquire of this version by an authenticated identity.
func acqAs(identity, resource, holder, requestID string, ttlMs int64) *wirepb.Command {
	return acqWith(&wirepb.AcquireCmd{Resource: resource, Holder: holder, TtlMs: ttlMs, RequestId: requestID,
		Identity: identity})
}

func relAs(identity, resource string, token uint64) *wirepb.Command {
	return &wirepb.Command{Op: &wirepb.Command_Release{Release: &wirepb.ReleaseCmd{Resource: resource, Token: token, Identity: identity}}}
}

func aclSample(a *applier) {
	a.apply(setACL(false,
		rule("alice", "jobs/", permRead, permLease),
		rule("bob", "jobs/", permRead, permLease),
		rule("reader", "", permRead),
		rule("ops", "", permRead, permLease, permAdmin)))
}

func TestACLGatesAcquireAndRelease(t *testing.T) {
	a := newApplier(t)
	// No rules ever set: an identity may do nothing (fail closed).
	if res := a.apply(acqAs("alice", "jobs/a", "h", "", 10_000)); res.Code != Denied {
		t.Fatalf("acquire before any rules = %v, want denied", res.Code)
	}
	aclSample(a)
	if res := a.apply(acqAs("reader", "jobs/a", "h", "", 10_000)); res.Code != Denied ||
		res.Denial != (Denial{Identity: "reader", Permission: permLease, Resource: "jobs/a"}) {
		t.Fatalf("read-only acquire = %v %+v, want denied lease", res.Code, res.Denial)
	}
	if res := a.apply(acqAs("alice", "other/a", "h", "", 10_000)); res.Code != Denied {
		t.Fatalf("acquire outside the prefix = %v, want denied", res.Code)
	}
	res := a.apply(acqAs("alice", "jobs/a", "h", "r1", 10_000))
	if res.Code != OK || res.Lease.Identity != "alice" {
		t.Fatalf("acquire = %v %+v", res.Code, res.Lease)
	}
	tok := res.Lease.Token
	if res := a.apply(relAs("bob", "jobs/a", tok)); res.Code != Denied ||
		res.Denial != (Denial{Identity: "bob", Permission: permAdmin, Resource: "jobs/a", Owner: "alice"}) {
		t.Fatalf("bob releases alice's lease = %v %+v, want denied admin", res.Code, res.Denial)
	}
	if !a.f.IsCurrent("jobs/a", tok) {
		t.Fatal("a denied release ended the lease")
	}
	res = a.apply(relAs("ops", "jobs/a", tok))
	if res.Code != OK || len(res.Events) != 1 || res.Events[0].By != "ops" || res.Events[0].Lease.Identity != "alice" {
		t.Fatalf("admin release = %v %+v", res.Code, res.Events)
	}
	// One's own release carries no By.
	tok = a.apply(acqAs("bob", "jobs/b", "h", "", 10_000)).Lease.Token
	if res := a.apply(relAs("bob", "jobs/b", tok)); res.Code != OK || res.Events[0].By != "" {
		t.Fatalf("own release = %v %+v", res.Code, res.Events)
	}
	// A rule change takes effect at its index.
	a.apply(setACL(false, rule("ops", "", permAdmin)))
	if res := a.apply(acqAs("alice", "jobs/c", "h", "", 10_000)); res.Code != Denied {
		t.Fatalf("acquire after the rules dropped alice = %v, want denied", res.Code)
	}
	// Without identities (no client-cert-auth) nothing is checked.
	if res := a.apply(acq("jobs/c", "anyone", "")); res.Code != OK {
		t.Fatalf("acquire without identity = %v", res.Code)
	}
}

func TestInitialACLAppliesOnce(t *testing.T) {
	a := newApplier(t)
	if res := a.apply(setACL(true, rule("first", "", permAdmin))); !res.Changes.ACLSet {
		t.Fatal("the first initial rules were not set")
	}
	if res := a.apply(setACL(true, rule("second", "", permAdmin))); res.Changes.ACLSet {
		t.Fatal("a second leader's initial rules replaced the first")
	}
	if rules, set := a.f.ACL(); !set || len(rules) != 1 || rules[0].GetIdentity() != "first" {
		t.Fatalf("ACL = %v, %v", rules, set)
	}
	// An explicit set replaces them, even with no rules, and then no initial set applies.
	a.apply(setACL(false))
	a.apply(setACL(true, rule("third", "", permAdmin)))
	if rules, set := a.f.ACL(); !set || len(rules) != 0 {
		t.Fatalf("ACL = %v, %v; want set and empty", rules, set)
	}
	// Malformed rules (a faulty proposer) change nothing.
	if res := a.apply(setACL(false, rule("", "", permAdmin))); res.Code != Invalid {
		t.Fatalf("bad rules = %v, want invalid", res.Code)
	}
}

func TestRequestIDsAreScopedToTheIdentity(t *testing.T) {
	a := newApplier(t)
	aclSample(a)
	victim := a.apply(acqAs("alice", "jobs/a", "worker", "r1", 10_000))
	// bob leaked alice's request id and holder label: no replay of her grant.
	res := a.apply(acqAs("bob", "jobs/a", "worker", "r1", 10_000))
	if res.Code != Held || res.Replayed {
		t.Fatalf("impersonation = %v replayed=%v, want held", res.Code, res.Replayed)
	}
	// alice's own retry replays.
	res = a.apply(acqAs("alice", "jobs/a", "worker", "r1", 10_000))
	if res.Code != OK || !res.Replayed || res.Lease.Token != victim.Lease.Token {
		t.Fatalf("retry = %v %+v", res.Code, res.Lease)
	}
	// bob may use the same request id for his own, distinct grant.
	res = a.apply(acqAs("bob", "jobs/b", "worker", "r1", 10_000))
	if res.Code != OK || res.Replayed || res.Lease.Token == victim.Lease.Token {
		t.Fatalf("bob's own r1 = %v %+v", res.Code, res.Lease)
	}
}

func TestRequestIDReuseWithOtherParametersIsRefused(t *testing.T) {
	a := newApplier(t)
	base := &wirepb.AcquireCmd{Resource: "r", Holder: "h", TtlMs: 30_000, Value: []byte("v"), RequestId: "r1", LockDelayMs: 5}
	first := a.apply(acqWith(proto.Clone(base).(*wirepb.AcquireCmd)))
	for _, tc := range []struct {
		field  string
		change func(*wirepb.AcquireCmd)
	}{
		{"ttl_ms", func(c *wirepb.AcquireCmd) { c.TtlMs = 50_000 }},
		{"resource", func(c *wirepb.AcquireCmd) { c.Resource = "other" }},
		{"value", func(c *wirepb.AcquireCmd) { c.Value = []byte("w") }},
		{"lock_delay_ms", func(c *wirepb.AcquireCmd) { c.LockDelayMs = 0 }},
	} {
		c := proto.Clone(base).(*wirepb.AcquireCmd)
		tc.change(c)
		res := a.apply(acqWith(c))
		if res.Code != RequestReused || res.Reuse.Field != tc.field || res.Reuse.RequestID != "r1" || res.Lease.Token != first.Lease.Token {
			t.Errorf("reuse with another %s = %v %+v", tc.field, res.Code, res.Reuse)
		}
	}
	if a.f.Len() != 1 {
		t.Fatalf("refused reuses granted: %d leases", a.f.Len())
	}
	// The same parameters replay; wait is not among them (it is not in the command).
	if res := a.apply(acqWith(proto.Clone(base).(*wirepb.AcquireCmd))); res.Code != OK || !res.Replayed {
		t.Fatalf("same parameters = %v replayed=%v", res.Code, res.Replayed)
	}
	// Once the grant ends the id is free again.
	a.apply(rel("r", first.Lease.Token))
	c := proto.Clone(base).(*wirepb.AcquireCmd)
	c.TtlMs = 50_000
	if res := a.apply(acqWith(c)); res.Code != OK || res.Replayed {
		t.Fatalf("after the release = %v", res.Code)
	}
}

func TestSnapshotKeepsIdentitiesAndACL(t *testing.T) {
	a := newApplier(t)
	aclSample(a)
	a.apply(acqAs("alice", "jobs/a", "worker", "r1", 10_000))
	snap := mustSnapshot(t, a.f)
	g, err := Restore(snap)
	if err != nil {
		t.Fatal(err)
	}
	if l, _ := g.Get("jobs/a"); l.Identity != "alice" || l.RequestID != "r1" {
		t.Fatalf("restored lease = %+v", l)
	}
	if rules, set := g.ACL(); !set || len(rules) != 4 || !g.Allows("ops", "", permAdmin) || g.Allows("reader", "x", permLease) {
		t.Fatalf("restored ACL = %v, %v", rules, set)
	}
	// The restored state enforces the same: the request id scope, the fingerprint, the release rule.
	b := &applier{t: t, f: g, next: g.AppliedIndex() + 1}
	if res := b.apply(acqAs("alice", "jobs/a", "worker", "r1", 20_000)); res.Code != RequestReused || res.Reuse.Field != "ttl_ms" {
		t.Fatalf("restored fingerprint = %v %+v", res.Code, res.Reuse)
	}
	if res := b.apply(relAs("bob", "jobs/a", 2)); res.Code != Denied {
		t.Fatalf("restored owner check = %v", res.Code)
	}
	// An empty rule set that was set stays "set" across a snapshot.
	c := newApplier(t)
	c.apply(setACL(false))
	h, err := Restore(mustSnapshot(t, c.f))
	if err != nil {
		t.Fatal(err)
	}
	if _, set := h.ACL(); !set {
		t.Fatal("an empty, set ACL came back unset")
	}
	if _, set := New().ACL(); set {
		t.Fatal("a new FSM has rules")
	}
}

func TestRestoreRejectsBadACL(t *testing.T) {
	a := newApplier(t)
	a.apply(acq("r", "h", ""))
	body := &wirepb.SnapshotBody{AppliedIndex: 1, HighestToken: 1, ForgottenThrough: proto.Uint64(0),
		Acl: &wirepb.AclState{Rules: []*leasepb.AclRule{rule("x", "", leasepb.Permission(42))}}}
	if _, err := Restore(sealed(t, body)); err == nil {
		t.Fatal("a snapshot with an unknown permission restored")
	}
}
