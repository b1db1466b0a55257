// Package acl is the vocabulary of leased's access control lists: the rule semantics every node applies
// (Allows), the limits a rule set must keep (Validate), and the YAML file format of --initial-acl-file and
// `leasectl acl get|set` (Parse, Marshal). The state machine (fsm/), the server and leasectl share it, so
// a rule means the same thing wherever it is read.
//
// A rule allows an identity (exact, or "*" for every authenticated identity) some permissions on every
// resource that starts with its prefix ("" covers every resource). Rules only allow; an identity's
// permissions on a resource are the union of the rules that match. A call on a range of resources (List
// and Watch with a prefix) needs a rule whose prefix is a prefix of the requested one, so that the rule
// covers every resource the call could return; a call on the whole cluster (members, snapshots, ACLs)
// needs a rule with prefix "".
package acl

import (
	"fmt"
	"strings"

	"github.com/leased/leased/api/leasepb"
)

// Limits of a rule set, enforced by Validate (and so by AclSet, --initial-acl-file and leasectl).
const (
	MaxRules         = 1000
	MaxIdentityBytes = 256
	MaxPrefixBytes   = 256
)

// Everyone is the identity of a rule that matches every authenticated identity.
const Everyone = "*"

// Error is a rule that breaks a limit: Field names it the way the API does ("rules[2].permissions").
type Error struct {
	Field, Reason string
}

func (e *Error) Error() string { return e.Field + ": " + e.Reason }

var permissionNames = map[leasepb.Permission]string{
	leasepb.Permission_PERMISSION_READ:  "read",
	leasepb.Permission_PERMISSION_LEASE: "lease",
	leasepb.Permission_PERMISSION_ADMIN: "admin",
}

// Name is a permission's name in the YAML format and in error messages: read, lease or admin.
func Name(p leasepb.Permission) string {
	if n, ok := permissionNames[p]; ok {
		return n
	}
	return p.String()
}

// ParsePermission reads a permission's name.
func ParsePermission(name string) (leasepb.Permission, bool) {
	for p, n := range permissionNames {
		if n == name {
			return p, true
		}
	}
	return leasepb.Permission_PERMISSION_UNSPECIFIED, false
}

// Allows reports whether rules give identity permission p on scope: a resource, the prefix of a List or
// Watch, or "" for a call on the whole cluster. A rule covers scope when scope starts with its prefix.
func Allows(rules []*leasepb.AclRule, identity, scope string, p leasepb.Permission) bool {
	for _, r := range rules {
		if (r.GetIdentity() == identity || r.GetIdentity() == Everyone) && strings.HasPrefix(scope, r.GetPrefix()) && has(r, p) {
			return true
		}
	}
	return false
}

func has(r *leasepb.AclRule, p leasepb.Permission) bool {
	for _, q := range r.GetPermissions() {
		if q == p {
			return true
		}
	}
	return false
}

// Validate checks a rule set against the limits: at most MaxRules rules; each with an identity (1..256
// printable ASCII bytes without spaces, or "*"), a prefix (at most 256 bytes of the resource characters
// [A-Za-z0-9] and "/_-.:@=+") and at least one permission, each known and listed once.
func Validate(rules []*leasepb.AclRule) error {
	if len(rules) > MaxRules {
		return &Error{Field: "rules", Reason: fmt.Sprintf("%d rules, the limit is %d", len(rules), MaxRules)}
	}
	for i, r := range rules {
		if err := validateRule(r); err != nil {
			err.Field = fmt.Sprintf("rules[%d].%s", i, err.Field)
			return err
		}
	}
	return nil
}

func validateRule(r *leasepb.AclRule) *Error {
	id := r.GetIdentity()
	switch {
	case id == "":
		return &Error{Field: "identity", Reason: `is required (an exact identity, or "*" for everyone)`}
	case len(id) > MaxIdentityBytes:
		return &Error{Field: "identity", Reason: fmt.Sprintf("is %d bytes, the limit is %d", len(id), MaxIdentityBytes)}
	case !printable(id):
		return &Error{Field: "identity", Reason: fmt.Sprintf("%q must be printable ASCII without spaces", id)}
	}
	if err := validatePrefix(r.GetPrefix()); err != nil {
		return err
	}
	if len(r.GetPermissions()) == 0 {
		return &Error{Field: "permissions", Reason: "at least one of read, lease, admin is required"}
	}
	seen := map[leasepb.Permission]bool{}
	for _, p := range r.GetPermissions() {
		if _, ok := permissionNames[p]; !ok {
			return &Error{Field: "permissions", Reason: fmt.Sprintf("unknown permission %v (want read, lease or admin)", p)}
		}
		if seen[p] {
			return &Error{Field: "permissions", Reason: fmt.Sprintf("%s is listed twice", Name(p))}
		}
		seen[p] = true
	}
	return nil
}

func validatePrefix(p string) *Error {
	if len(p) > MaxPrefixBytes {
		return &Error{Field: "prefix", Reason: fmt.Sprintf("is %d bytes, the limit is %d", len(p), MaxPrefixBytes)}
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("/_-.:@=+", c) >= 0) {
			return &Error{Field: "prefix", Reason: fmt.Sprintf("%q has a character outside [A-Za-z0-9] and \"/_-.:@=+\" at byte %d", p, i)}
		}
	}
	return nil
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}
