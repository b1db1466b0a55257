package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/leased/leased/api/acl"
	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server/servertest"
)

// leasectl against a three-node cluster that requires client certificates and enforces ACLs: the acl
// commands, exit 6 for refusals, and the request id fingerprint.

const initialRules = `rules:
  - identity: ops
    prefix: ""
    permissions: [read, lease, admin]
  - identity: alice
    prefix: jobs/
    permissions: [read, lease]
  - identity: bob
    prefix: jobs/
    permissions: [read, lease]
  - identity: reader
    prefix: ""
    permissions: [read]
`

func TestACLCommands(t *testing.T) {
	rules, err := acl.Parse([]byte(initialRules))
	if err != nil {
		t.Fatal(err)
	}
	ca := servertest.NewCA(t)
	c := servertest.StartWithACL(t, 3, ca, "ops", rules, nil)
	dir := t.TempDir()
	as := func(identity string) func(args ...string) result {
		caFile, cert, key := ca.ClientFiles(dir, identity)
		return func(args ...string) result {
			t.Helper()
			return ctl(t, c.Endpoints(), append([]string{"--cacert", caFile, "--cert", cert, "--key", key}, args...)...)
		}
	}
	ops, alice, bob, reader := as("ops"), as("alice"), as("bob"), as("reader")

	t.Run("GetPrintsTheRulesAsYAML", func(t *testing.T) {
		r := want(t, ops("acl", "get"), 0)
		got, err := acl.Parse([]byte(r.stdout))
		if err != nil {
			t.Fatalf("acl get printed %q: %v", r.stdout, err)
		}
		if len(got) != len(rules) || got[1].GetIdentity() != "alice" || got[1].GetPrefix() != "jobs/" {
			t.Fatalf("acl get = %v", got)
		}
		r = want(t, ops("-o", "json", "acl", "get"), 0)
		if !strings.Contains(r.stdout, `"set":true`) || !strings.Contains(r.stdout, "PERMISSION_ADMIN") {
			t.Fatalf("acl get -o json = %s", r.stdout)
		}
	})

	t.Run("RefusalsExit6", func(t *testing.T) {
		r := want(t, alice("acl", "get"), 6)
		if !strings.Contains(r.stderr, `identity "alice" lacks permission admin`) {
			t.Fatalf("stderr %q", r.stderr)
		}
		r = want(t, reader("acquire", "jobs/ro", "--ttl", "30s"), 6)
		if !strings.Contains(r.stderr, `identity "reader" lacks permission lease on "jobs/ro"`) {
			t.Fatalf("stderr %q", r.stderr)
		}
		r = want(t, reader("-o", "json", "acquire", "jobs/ro", "--ttl", "30s"), 6)
		lines := strings.Split(strings.TrimSpace(r.stderr), "\n") // the error is the last line (after any TLS warning)
		if e := mustJSON[map[string]any](t, lines[len(lines)-1]); e["identity"] != "reader" || e["permission"] != "lease" || e["code"] != float64(6) {
			t.Fatalf("json error %v", e)
		}
	})

	t.Run("OwnerAdminAndRequestIDs", func(t *testing.T) {
		l := mustJSON[leaseJSON](t, want(t, alice("-o", "json", "acquire", "jobs/x", "--ttl", "30s", "--request-id", "r1"), 0).stdout)
		tok := strconv.FormatUint(l.Token, 10)
		// The same request id with another TTL: refused, naming the difference (exit 2, nothing changed).
		r := want(t, alice("acquire", "jobs/x", "--ttl", "50s", "--request-id", "r1"), 2)
		if !strings.Contains(r.stderr, "ttl_ms") || !strings.Contains(r.stderr, "30000") {
			t.Fatalf("reuse: %q", r.stderr)
		}
		// The same request again replays the grant.
		again := mustJSON[leaseJSON](t, want(t, alice("-o", "json", "acquire", "jobs/x", "--ttl", "30s", "--request-id", "r1"), 0).stdout)
		if again.Token != l.Token {
			t.Fatalf("replay token %d, want %d", again.Token, l.Token)
		}
		// bob: his own request id r1 is no key to alice's grant; her lease is not his to renew or release.
		want(t, bob("acquire", "jobs/x", "--ttl", "30s", "--request-id", "r1"), 3)
		for _, args := range [][]string{{"renew", "jobs/x", "--token", tok}, {"release", "jobs/x", "--token", tok}} {
			r := want(t, bob(args...), 6)
			if !strings.Contains(r.stderr, `identity "bob" lacks permission admin on "jobs/x": the lease belongs to identity "alice"`) {
				t.Fatalf("%v: %q", args, r.stderr)
			}
		}
		// bob's get shows alice's identity and no request id.
		info := mustJSON[infoJSON](t, want(t, bob("-o", "json", "get", "jobs/x"), 0).stdout)
		if info.Identity != "alice" || info.Token != l.Token {
			t.Fatalf("get = %+v", info)
		}
		want(t, alice("renew", "jobs/x", "--token", tok), 0)
		want(t, ops("release", "jobs/x", "--token", tok), 0) // admin
		want(t, alice("get", "jobs/x"), 4)
	})

	t.Run("SetReplacesTheRulesThroughTheLog", func(t *testing.T) {
		bad := filepath.Join(dir, "bad.yaml")
		if err := os.WriteFile(bad, []byte("rules:\n  - identity: ops\n    prefix: \"\"\n    permissions: [admin, superuser]\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		r := want(t, ops("acl", "set", bad), 2)
		if !strings.Contains(r.stderr, `unknown permission "superuser"`) {
			t.Fatalf("bad file: %q", r.stderr)
		}
		unknownKey := filepath.Join(dir, "unknown.yaml")
		if err := os.WriteFile(unknownKey, []byte("rules:\n  - identity: ops\n    prefix: \"\"\n    permissions: [admin]\n    deny: [read]\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if r := want(t, ops("acl", "set", unknownKey), 2); !strings.Contains(r.stderr, "field deny not found") {
			t.Fatalf("unknown key: %q", r.stderr)
		}
		// reader gains lease on jobs/: every node enforces it from the entry on, without a restart.
		more := filepath.Join(dir, "more.yaml")
		if err := os.WriteFile(more, []byte(initialRules+"  - identity: reader\n    prefix: jobs/\n    permissions: [lease]\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		r = want(t, ops("acl", "set", more), 0)
		if !strings.Contains(r.stdout, "set 5 rules at index") {
			t.Fatalf("acl set: %q", r.stdout)
		}
		l := mustJSON[leaseJSON](t, want(t, reader("-o", "json", "acquire", "jobs/now-allowed", "--ttl", "30s"), 0).stdout)
		want(t, reader("release", "jobs/now-allowed", "--token", strconv.FormatUint(l.Token, 10)), 0)
		got, err := acl.Parse([]byte(want(t, ops("acl", "get"), 0).stdout))
		if err != nil || len(got) != 5 || got[4].GetPermissions()[0] != leasepb.Permission_PERMISSION_LEASE {
			t.Fatalf("acl get after set = %v, %v", got, err)
		}
	})
}

// Without client certificates there are no identities, but the request id fingerprint holds all the same.
func testRequestIDReuse(t *testing.T, eps []string) {
	want(t, ctl(t, eps, "acquire", "reuse/a", "--ttl", "30s", "--request-id", "r1"), 0)
	r := want(t, ctl(t, eps, "acquire", "reuse/a", "--ttl", "50s", "--request-id", "r1"), 2)
	if !strings.Contains(r.stderr, "ttl_ms") || !strings.Contains(r.stderr, `request id "r1" was first used with ttl_ms 30000`) {
		t.Fatalf("reuse: %q", r.stderr)
	}
	want(t, ctl(t, eps, "acquire", "reuse/a", "--ttl", "30s", "--request-id", "r1"), 0)
}
