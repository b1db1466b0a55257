// Package deps checks the dependency direction of docs/design.md ("Packages and dependency direction"): arrows only point down the list
// api -> fsm -> raftlog -> server -> client -> cmd, with the exceptions the contract names. It reads the
// non-test imports of every package in the module with `go list`, so a forbidden import fails the tests.
package deps

import (
	"bufio"
	"bytes"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/leased/leased"

// allowed lists, for each part of the tree, the parts of ours it may import (besides itself and its own
// subpackages: so client may import client/fence, while client/fence, the most specific rule, imports
// nothing of ours). Tests may import more (a client test starts a real server); only non-test code is checked.
var allowed = map[string][]string{
	"api":     {"api"},
	"fsm":     {"api"},
	"raftlog": {"internal/fileutil"},
	"server":  {"api", "fsm", "raftlog", "internal/fileutil"},
	// The node's internal packages (docs/design.md, "Packages and dependency direction"): each imports
	// only those below it, never package server.
	"server/internal/errs":   {},
	"server/internal/clock":  {},
	"server/internal/ids":    {},
	"server/internal/waitq":  {"api", "fsm", "server/internal/errs"},
	"server/internal/watch":  {"api", "fsm", "server/internal/errs"},
	"server/internal/lessor": {"api", "fsm", "server/internal/errs"},
	"server/internal/auth":   {"api", "fsm", "server/internal/leases"}, // the audit trail waits on leases.IndexWaiter
	"server/internal/leases": {"api", "fsm", "server/internal/errs"},
	// The raft host never imports the lease service (nor lessor, waitq, watch or auth).
	"server/internal/raftnode": {"api", "raftlog", "server/transport", "server/internal/errs"},
	"server/restore":           {"api", "fsm", "raftlog", "internal/fileutil", "server/internal/errs", "server/internal/ids"}, // the offline restore, never the node
	"client/fence":             {},
	"client":                   {"api"},
	"cmd/internal":             {},
	"cmd/leased":               {"api", "server", "raftlog", "cmd/internal", "internal/fileutil"},
	"cmd/leasectl":             {"api", "client", "fsm", "server/restore", "cmd/internal", "internal/fileutil"}, // fsm, server/restore: offline snapshot status and restore
	"tests":                    {"api", "client", "server", "fsm", "raftlog"},

	// The request path reaches the node only through rpc.LeaseHost and the parts it is handed, never
	// package server.
	"server/internal/rpc": {"api", "fsm", "server/tlsfiles", "server/internal/errs", "server/internal/clock", "server/internal/auth",
		"server/internal/lessor", "server/internal/waitq", "server/internal/watch", "server/internal/raftnode", "server/transport"},

	// Membership reaches the rest of the node only through membership.Host, never package server.
	"server/internal/membership": {"api", "fsm", "server/transport", "server/internal/errs", "server/internal/ids"},

	// Helpers below every layer, for any of them.
	"internal/fileutil": {},
}

// part names the rule a package falls under: the longest key of allowed that prefixes it.
func part(pkg string) string {
	best := ""
	for p := range allowed {
		if (pkg == p || strings.HasPrefix(pkg, p+"/")) && len(p) > len(best) {
			best = p
		}
	}
	return best
}

// violations returns "a -> b" for every import of ours that the rules forbid. imports maps a package
// (relative to the module) to the packages of ours it imports.
func violations(imports map[string][]string) []string {
	var out []string
	for pkg, deps := range imports {
		from := part(pkg)
		if from == "" {
			out = append(out, pkg+": no rule covers this package (add it to allowed)")
			continue
		}
		for _, dep := range deps {
			to := part(dep)
			if to == from || strings.HasPrefix(dep, from+"/") {
				continue
			}
			ok := false
			for _, a := range allowed[from] {
				if dep == a || strings.HasPrefix(dep, a+"/") {
					ok = true
				}
			}
			if !ok {
				out = append(out, pkg+" -> "+dep)
			}
		}
	}
	return out
}

func TestImportsPointDownTheLayers(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", module+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	imports := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		pkg := strings.TrimPrefix(fields[0], module+"/")
		var ours []string
		for _, imp := range fields[1:] {
			if strings.HasPrefix(imp, module+"/") {
				ours = append(ours, strings.TrimPrefix(imp, module+"/"))
			}
		}
		imports[pkg] = ours
	}
	if len(imports) < 10 {
		t.Fatalf("go list found only %d packages", len(imports))
	}
	for _, v := range violations(imports) {
		t.Errorf("forbidden import: %s", v)
	}
}

// The checker itself catches the arrows docs/design.md forbids.
func TestViolationsCatchesForbiddenArrows(t *testing.T) {
	bad := map[string][]string{
		"fsm":                      {"server"},
		"client":                   {"server/servertest"},
		"api/leasepb":              {"client"},
		"raftlog":                  {"fsm"},
		"server/transport":         {"client/fence"},
		"client/fence/pg":          {"client"},
		"server/internal/waitq":    {"server"},
		"server/internal/raftnode": {"server/internal/lessor"},
		"server/restore":           {"server"},
		"server/internal/rpc":      {"server"},
	}
	got := violations(bad)
	if len(got) != len(bad) {
		t.Fatalf("violations = %v, want one per package of %v", got, bad)
	}
	good := map[string][]string{
		"server":                {"api/leasepb", "api/wirepb", "fsm", "raftlog", "server/transport"},
		"client":                {"api/leasepb", "client/internal/x"},
		"cmd/leasectl":          {"client", "client/fence", "api/leasepb"},
		"client/fence/pg":       {"client/fence"},
		"server/transport":      {"api/wirepb"},
		"server/internal/waitq": {"server/internal/errs", "fsm"},
	}
	if got := violations(good); len(got) != 0 {
		t.Fatalf("allowed arrows reported: %v", got)
	}
}

// TestSDKDoesNotImportTheGateway: the HTTP/JSON gateway lives in api/leasepb/gw so that programs using the
// SDK do not link grpc-gateway's runtime (docs/design.md, "Packages and dependency direction").
func TestSDKDoesNotImportTheGateway(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", module+"/client", module+"/client/fence/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "github.com/grpc-ecosystem/grpc-gateway") || pkg == module+"/api/leasepb/gw" {
			t.Errorf("the SDK depends on %s", pkg)
		}
	}
}

// TestLeasectlDoesNotLinkTheServer: the CLI's offline `snapshot restore` uses package server/restore, so
// leasectl does not link package server (nor, through it, the node's services and the gateway). The rules
// above check direct imports only; this checks the whole build.
func TestLeasectlDoesNotLinkTheServer(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", module+"/cmd/leasectl").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, module+"/server/restore") {
		t.Fatalf("leasectl does not link %s/server/restore: the check looks at the wrong build", module)
	}
	if slices.Contains(deps, module+"/server") {
		t.Errorf("leasectl depends on %s/server", module)
	}
}
