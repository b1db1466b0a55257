package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/leased/leased/api/leasepb"
)

func writeFile(t *testing.T, name, data string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestInitialACLFile(t *testing.T) {
	good := writeFile(t, "acl.yaml", `rules:
  - identity: alice
    prefix: jobs/
    permissions: [read, lease]
  - identity: ops
    prefix: ""
    permissions: [read, lease, admin]
`)
	for _, tc := range []struct {
		name   string
		args   []string
		getenv func(string) string
	}{
		{"flag", []string{"--initial-acl-file", good}, nil},
		{"environment", nil, env("LEASED_INITIAL_ACL_FILE", good)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parse(t, tc.args, tc.getenv)
			if err != nil {
				t.Fatal(err)
			}
			rules := o.cfg.InitialACL
			if len(rules) != 2 || rules[0].GetIdentity() != "alice" || rules[0].GetPrefix() != "jobs/" ||
				rules[1].GetPermissions()[2] != leasepb.Permission_PERMISSION_ADMIN {
				t.Fatalf("rules = %v", rules)
			}
		})
	}
	o, err := parse(t, []string{"--initial-acl-file", writeFile(t, "none.yaml", "rules: []\n")}, nil)
	if err != nil || o.cfg.InitialACL == nil || len(o.cfg.InitialACL) != 0 {
		t.Fatalf("rules: [] = %v, %v; want an empty, non-nil rule set", o.cfg.InitialACL, err)
	}
	if o, _ := parse(t, nil, nil); o.cfg.InitialACL != nil {
		t.Fatalf("no flag gave rules %v", o.cfg.InitialACL)
	}
}

func TestBadInitialACLFileIsAUsageError(t *testing.T) {
	for _, tc := range []struct{ name, file, want string }{
		{"bad permission", "rules:\n  - identity: a\n    prefix: \"\"\n    permissions: [write]\n", `unknown permission "write"`},
		{"unknown field", "rules:\n  - identity: a\n    prefix: \"\"\n    permissions: [read]\n    role: x\n", "field role not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, "acl.yaml", tc.file)
			_, err := parse(t, []string{"--initial-acl-file", path}, nil)
			var ue usageError
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
				t.Fatalf("got %v, want a usage error naming %s and %q", err, path, tc.want)
			}
		})
	}
	_, err := parse(t, []string{"--initial-acl-file", "/no/such/acl.yaml"}, nil)
	var ue usageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("missing file: %v", err)
	}
}
