package acl

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/leasepb"
)

const issueExample = `
rules:
  - identity: alice        # exact identity, or "*"
    prefix: jobs/          # resource prefix; "" is every resource
    permissions: [read, lease]
  - identity: ops
    prefix: ""
    permissions: [read, lease, admin]
`

func TestParseTheDocumentedFormat(t *testing.T) {
	rules, err := Parse([]byte(issueExample))
	if err != nil {
		t.Fatal(err)
	}
	want := []*leasepb.AclRule{
		{Identity: "alice", Prefix: "jobs/", Permissions: []leasepb.Permission{leasepb.Permission_PERMISSION_READ, leasepb.Permission_PERMISSION_LEASE}},
		{Identity: "ops", Prefix: "", Permissions: []leasepb.Permission{leasepb.Permission_PERMISSION_READ, leasepb.Permission_PERMISSION_LEASE, leasepb.Permission_PERMISSION_ADMIN}},
	}
	if len(rules) != len(want) {
		t.Fatalf("got %d rules, want %d", len(rules), len(want))
	}
	for i := range want {
		if !proto.Equal(rules[i], want[i]) {
			t.Errorf("rule %d = %v, want %v", i, rules[i], want[i])
		}
	}
	// Marshal writes what Parse reads.
	out, err := Marshal(rules)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Parse(out)
	if err != nil {
		t.Fatalf("parse %q: %v", out, err)
	}
	for i := range want {
		if !proto.Equal(again[i], want[i]) {
			t.Errorf("round trip rule %d = %v, want %v", i, again[i], want[i])
		}
	}
	if none, err := Parse([]byte("rules: []\n")); err != nil || len(none) != 0 {
		t.Errorf("rules: [] = %v, %v; want no rules", none, err)
	}
}

func TestParseRefusesBadFiles(t *testing.T) {
	for _, tc := range []struct{ name, file, want string }{
		{"bad permission", "rules:\n  - identity: a\n    prefix: \"\"\n    permissions: [read, write]\n", `rules[0].permissions: unknown permission "write"`},
		{"unknown rule field", "rules:\n  - identity: a\n    prefix: \"\"\n    permissions: [read]\n    deny: true\n", "field deny not found"},
		{"unknown top field", "rules: []\nversion: 2\n", "field version not found"},
		{"missing prefix", "rules:\n  - identity: a\n    permissions: [read]\n", `rules[0].prefix: is required`},
		{"missing identity", "rules:\n  - prefix: x/\n    permissions: [read]\n", "rules[0].identity: is required"},
		{"no permissions", "rules:\n  - identity: a\n    prefix: x/\n    permissions: []\n", "rules[0].permissions: at least one"},
		{"twice", "rules:\n  - identity: a\n    prefix: x/\n    permissions: [read, read]\n", "read is listed twice"},
		{"bad prefix", "rules:\n  - identity: a\n    prefix: \"x y\"\n    permissions: [read]\n", "rules[0].prefix"},
		{"spaces in identity", "rules:\n  - identity: \"a b\"\n    prefix: \"\"\n    permissions: [read]\n", "rules[0].identity"},
		{"empty", "", "the file is empty"},
		{"no rules key", "{}\n", `no "rules" key`},
		{"not yaml", "rules: [\n", "acl: yaml"},
		{"two documents", "rules: []\n---\nrules: []\n", "more than one YAML document"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.file))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestAllows(t *testing.T) {
	rules, err := Parse([]byte(issueExample + "  - identity: \"*\"\n    prefix: public/\n    permissions: [read]\n"))
	if err != nil {
		t.Fatal(err)
	}
	const (
		read  = leasepb.Permission_PERMISSION_READ
		lease = leasepb.Permission_PERMISSION_LEASE
		admin = leasepb.Permission_PERMISSION_ADMIN
	)
	for _, tc := range []struct {
		identity, scope string
		p               leasepb.Permission
		want            bool
	}{
		{"alice", "jobs/a", lease, true},
		{"alice", "jobs/", read, true},     // the rule's own prefix (a List of it)
		{"alice", "jobs/x/", read, true},   // a narrower prefix
		{"alice", "job", read, false},      // wider than the rule: it would list jobs2/ too
		{"alice", "", read, false},         // everything
		{"alice", "jobs/a", admin, false},  // never granted
		{"alice", "other/a", lease, false}, // outside the prefix
		{"alice", "public/a", read, true},  // "*"
		{"alice", "public/a", lease, false},
		{"mallory", "public/a", read, true},
		{"mallory", "jobs/a", read, false},
		{"ops", "", admin, true},
		{"ops", "anything", lease, true},
		{"Alice", "jobs/a", read, false}, // exact match only
	} {
		if got := Allows(rules, tc.identity, tc.scope, tc.p); got != tc.want {
			t.Errorf("Allows(%s, %q, %s) = %v, want %v", tc.identity, tc.scope, Name(tc.p), got, tc.want)
		}
	}
	if Allows(nil, "ops", "", admin) {
		t.Error("no rules allowed something")
	}
}

func TestValidateLimits(t *testing.T) {
	many := make([]*leasepb.AclRule, MaxRules+1)
	for i := range many {
		many[i] = &leasepb.AclRule{Identity: "a", Permissions: []leasepb.Permission{leasepb.Permission_PERMISSION_READ}}
	}
	if err := Validate(many); err == nil || !strings.Contains(err.Error(), "the limit is 1000") {
		t.Errorf("Validate(1001 rules) = %v", err)
	}
	bad := []*leasepb.AclRule{{Identity: "a", Permissions: []leasepb.Permission{leasepb.Permission(9)}}}
	if err := Validate(bad); err == nil || !strings.Contains(err.Error(), "rules[0].permissions: unknown permission") {
		t.Errorf("Validate(unknown permission) = %v", err)
	}
	long := []*leasepb.AclRule{{Identity: strings.Repeat("a", MaxIdentityBytes+1), Permissions: []leasepb.Permission{leasepb.Permission_PERMISSION_READ}}}
	if err := Validate(long); err == nil || !strings.Contains(err.Error(), "rules[0].identity") {
		t.Errorf("Validate(long identity) = %v", err)
	}
}
