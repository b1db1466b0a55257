package fsm

import (
	"testing"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
)

// Command builders keep the tests readable.

func acq(resource, holder, requestID string) *wirepb.Command {
	return &wirepb.Command{Op: &wirepb.Command_Acquire{Acquire: &wirepb.AcquireCmd{
		Resource: resource, Holder: holder, TtlMs: 10_000, RequestId: requestID,
	}}}
}

func acqWith(c *wirepb.AcquireCmd) *wirepb.Command {
	return &wirepb.Command{Op: &wirepb.Command_Acquire{Acquire: c}}
}

func rel(resource string, token uint64) *wirepb.Command {
	return &wirepb.Command{Op: &wirepb.Command_Release{Release: &wirepb.ReleaseCmd{Resource: resource, Token: token}}}
}

func refs(pairs ...any) []*leasepb.LeaseRef {
	var out []*leasepb.LeaseRef
	for i := 0; i < len(pairs); i += 2 {
		out = append(out, &leasepb.LeaseRef{Resource: pairs[i].(string), Token: uint64(pairs[i+1].(int))})
	}
	return out
}

func expire(pairs ...any) *wirepb.Command {
	return &wirepb.Command{Op: &wirepb.Command_Expire{Expire: &wirepb.ExpireCmd{Leases: refs(pairs...)}}}
}

func endDelay(pairs ...any) *wirepb.Command {
	return &wirepb.Command{Op: &wirepb.Command_EndLockDelay{EndLockDelay: &wirepb.EndLockDelayCmd{Delays: refs(pairs...)}}}
}

func renew(pairs ...any) *wirepb.Command {
	return &wirepb.Command{Op: &wirepb.Command_Renew{Renew: &wirepb.RenewCmd{Leases: refs(pairs...)}}}
}

func checkpoint(cps ...*wirepb.LeaseCheckpoint) *wirepb.Command {
	return &wirepb.Command{Op: &wirepb.Command_Checkpoint{Checkpoint: &wirepb.CheckpointCmd{Leases: cps}}}
}

// applier applies commands at consecutive indexes and fails the test on an Apply error.
type applier struct {
	t    testing.TB
	f    *FSM
	next uint64
}

func newApplier(t testing.TB) *applier { return &applier{t: t, f: New(), next: 1} }

func (a *applier) apply(cmd *wirepb.Command) Result {
	a.t.Helper()
	res, err := a.f.Apply(a.next, cmd)
	if err != nil {
		a.t.Fatalf("apply at %d: %v", a.next, err)
	}
	a.next++
	return res
}

func mustSnapshot(t testing.TB, f *FSM) []byte {
	t.Helper()
	b, err := f.Snapshot()
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	return b
}

// sampleCommands has one command of every kind, for fuzz seeds.
func sampleCommands() []*wirepb.Command {
	return []*wirepb.Command{
		acq("svc/leader", "node-9", "q"),
		acqWith(&wirepb.AcquireCmd{Resource: "new", Holder: "h", TtlMs: 1, Value: []byte("v"), LockDelayMs: 10, HolderLimit: 1}),
		rel("svc/leader", 1),
		expire("cron/backup", 2, "svc/leader", 1),
		checkpoint(&wirepb.LeaseCheckpoint{Resource: "svc/leader", Token: 1, RemainingMs: 7, Renewed: true}),
		renew("cron/backup", 2),
		endDelay("cron/vacuum", 3),
		setACL(false, rule("alice", "jobs/", leasepb.Permission_PERMISSION_LEASE)),
		acqWith(&wirepb.AcquireCmd{Resource: "jobs/a", Holder: "h", TtlMs: 10, RequestId: "r", Identity: "alice"}),
		acqWith(&wirepb.AcquireCmd{Resource: "sem", Holder: "h", TtlMs: 10, Limit: 2}),
		acqWith(&wirepb.AcquireCmd{Resource: "svc/leader", Holder: "node-9", TtlMs: 10, RequestId: "q", Attempt: 2, Wait: true}),
		{Op: &wirepb.Command_Proclaim{Proclaim: &wirepb.ProclaimCmd{Resource: "svc/leader", Token: 1, Value: []byte("v")}}},
		handoff("svc/leader", 1, &wirepb.AcquireCmd{Resource: "svc/leader", Holder: "node-2", TtlMs: 10, RequestId: "w"}),
	}
}

// handoff is a Release of (resource, token) carrying the Acquire c of the resource's head waiter.
func handoff(resource string, token uint64, c *wirepb.AcquireCmd) *wirepb.Command {
	return &wirepb.Command{Op: &wirepb.Command_ReleaseHandoff{ReleaseHandoff: &wirepb.ReleaseHandoffCmd{
		Release: &wirepb.ReleaseCmd{Resource: resource, Token: token}, Acquire: c, AcquireProposalId: 7,
	}}}
}

func setACL(initial bool, rules ...*leasepb.AclRule) *wirepb.Command {
	return &wirepb.Command{Op: &wirepb.Command_SetAcl{SetAcl: &wirepb.SetAclCmd{Rules: rules, Initial: initial}}}
}

func rule(identity, prefix string, perms ...leasepb.Permission) *leasepb.AclRule {
	return &leasepb.AclRule{Identity: identity, Prefix: prefix, Permissions: perms}
}
