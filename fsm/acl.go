package fsm

import (
	"github.com/leased/leased/api/acl"
	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
)

// The ACL lives in the replicated state (decision 10): a SetAcl entry replaces the rules on every node at
// the same index, and the state machine itself checks the permissions of the commands that carry an
// identity (Acquire needs lease; Release needs lease, or admin for another identity's lease), so a rule
// change between a leader's check and the entry's apply cannot let a refused command through.

// setACL replaces the rules. An initial set (--initial-acl-file) applies only while no rules were ever set.
func (f *FSM) setACL(c *wirepb.SetAclCmd) Result {
	if c.GetInitial() && f.aclSet {
		return Result{Code: OK}
	}
	if acl.Validate(c.GetRules()) != nil {
		return Result{Code: Invalid}
	}
	f.acl = cloneRules(c.GetRules())
	f.aclSet = true
	return Result{Code: OK, Changes: Changes{ACLSet: true}}
}

func cloneRules(rules []*leasepb.AclRule) []*leasepb.AclRule {
	out := make([]*leasepb.AclRule, len(rules))
	for i, r := range rules {
		out[i] = &leasepb.AclRule{Identity: r.GetIdentity(), Prefix: r.GetPrefix(), Permissions: append([]leasepb.Permission(nil), r.GetPermissions()...)}
	}
	return out
}

// ACL returns the rules and whether any were ever set. The rules are shared: callers must not change them.
func (f *FSM) ACL() ([]*leasepb.AclRule, bool) { return f.acl, f.aclSet }

// Allows reports whether the rules give identity permission p on scope (a resource, a List or Watch
// prefix, or "" for the whole cluster; see package acl). With no rules ever set, nothing is allowed.
func (f *FSM) Allows(identity, scope string, p leasepb.Permission) bool {
	return f.aclSet && acl.Allows(f.acl, identity, scope, p)
}

// mayRelease decides whether identity may release l: its own lease needs lease (or admin) on the
// resource, another identity's (or one granted without identity) needs admin.
func (f *FSM) mayRelease(identity string, l *lease) (Denial, bool) {
	need := leasepb.Permission_PERMISSION_LEASE
	if l.identity != identity {
		need = leasepb.Permission_PERMISSION_ADMIN
	}
	if f.Allows(identity, l.resource, need) || f.Allows(identity, l.resource, leasepb.Permission_PERMISSION_ADMIN) {
		return Denial{}, false
	}
	d := Denial{Identity: identity, Permission: need, Resource: l.resource}
	if l.identity != identity {
		d.Owner = l.identity
	}
	return d, true
}
