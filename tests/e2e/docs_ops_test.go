package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/acl"
	"github.com/leased/leased/tests/internal/proc"
)

// The examples of docs/operations.md and docs/security.md that no other test runs: the start line of
// "Running a node", the backup and restore of "Back up and restore", the audit trail's sample lines, the
// Prometheus scrape configuration and security.md's ACL rules.

// docNodeHost is the host of node nK in "Running a node": 10.0.0.K.
const docNodeHost = "10.0.0.%d:"

// TestOperationsDocExamples starts three nodes with docs/operations.md's "Running a node" command line
// as written, 10.0.0.K:PORT being node nK's free loopback port and /var/lib/leased its own data dir, and
// waits until each answers /readyz 200. Against that cluster it runs the backup and restore runbook's
// commands (restoreDocExample), sets docs/security.md's ACL rules (securityACLExample), and checks the
// audit trail's sample lines against what the leader wrote (auditDocExample).
func TestOperationsDocExamples(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test: skipped with -short")
	}
	md := readDoc(t, "docs/operations.md")
	nodes := startDocNodes(t, docBlock(t, md, "", "leased --name n1 "))
	var endpoints []string
	for _, n := range nodes {
		endpoints = append(endpoints, n.ClientAddr)
	}
	ctlOK(t, endpoints, "acquire", "docs/audit", "--ttl", "30s")

	t.Run("backup and restore", func(t *testing.T) { restoreDocExample(t, md, endpoints) })
	aclSet := t.Run("security.md acl", func(t *testing.T) { securityACLExample(t, readDoc(t, "docs/security.md"), endpoints) })
	t.Run("audit trail", func(t *testing.T) { auditDocExample(t, md, nodes, aclSet) })
}

// docBlock returns the first code block of md with info string lang that starts with prefix.
func docBlock(t *testing.T, md, lang, prefix string) string {
	t.Helper()
	for _, b := range codeBlocks(md, lang) {
		if strings.HasPrefix(b, prefix) {
			return b
		}
	}
	t.Fatalf("no ```%s block starting %q: the example changed, update the test", lang, prefix)
	return ""
}

// docCommand splits a shell command of the docs, continuation lines joined, into words.
func docCommand(cmd string) []string {
	return strings.Fields(strings.ReplaceAll(cmd, "\\\n", " "))
}

// startDocNodes runs the command line of "Running a node" as n1, n2 and n3: node nK's own flags get
// 10.0.0.K's addresses, every 10.0.0.K:PORT becomes a free loopback address and /var/lib/leased nK's data
// dir. It waits until every node answers /readyz 200 and returns the nodes (their log files hold their
// stderr, and so the audit trail).
func startDocNodes(t *testing.T, block string) []*proc.Node {
	t.Helper()
	words := docCommand(block)
	if words[0] != "leased" {
		t.Fatalf("docs/operations.md, Running a node: the command runs %q", words[0])
	}
	dir := t.TempDir()
	var pairs []string
	var nodes []*proc.Node
	for k := 1; k <= 3; k++ {
		addrs := proc.FreeAddrs(t, 4)
		host := fmt.Sprintf(docNodeHost, k)
		pairs = append(pairs, host+"7101", addrs[0], host+"7201", addrs[1], host+"7401", addrs[2], host+"7501", addrs[3])
		nodes = append(nodes, &proc.Node{Name: fmt.Sprintf("n%d", k), DataDir: filepath.Join(dir, fmt.Sprintf("n%d", k)),
			LogPath: filepath.Join(dir, fmt.Sprintf("n%d.log", k)), ClientAddr: addrs[0], PeerAddr: addrs[1], AdminAddr: addrs[2]})
	}
	subst := strings.NewReplacer(pairs...)
	exited := make([]<-chan struct{}, len(nodes))
	for k, n := range nodes {
		args := make([]string, len(words)-1)
		for i, a := range words[1:] {
			switch prev := words[i]; {
			case prev == "--name" && a == "n1":
				a = n.Name
			case strings.HasSuffix(prev, "-addr"): // the node's own addresses
				a = strings.Replace(a, fmt.Sprintf(docNodeHost, 1), fmt.Sprintf(docNodeHost, k+1), 1)
			case prev == "--data-dir" && a == "/var/lib/leased":
				a = n.DataDir
			}
			args[i] = subst.Replace(a)
			if strings.Contains(args[i], "10.0.0.") || strings.HasPrefix(args[i], "/var/") {
				t.Fatalf("docs/operations.md, Running a node: %s is not an address or path the test knows", a)
			}
		}
		exited[k] = runLeased(t, n.LogPath, args)
	}
	client := &http.Client{Timeout: time.Second}
	for k, n := range nodes {
		err := proc.Poll(20*time.Second, func() bool {
			select {
			case <-exited[k]:
				t.Fatalf("%s exited:\n%s", n.Name, tail(n.LogPath, 20))
			default:
			}
			resp, err := client.Get("http://" + n.AdminAddr + "/readyz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
		if err != nil {
			t.Fatalf("%s started with docs/operations.md's command line is not ready: %v\n%s", n.Name, err, tail(n.LogPath, 20))
		}
	}
	return nodes
}

// restoreDocExample runs "Back up and restore": the save command against the cluster (/backup/ is a
// temporary directory), then the restore command (10.0.1.K:7201 free addresses, /var/lib/leased an
// absent directory). The restore's output must have the lines shown, field by field: words as shown,
// numbers and 16-digit hex ids any other, the token floor the same in both places. The same restore
// again is refused with exit 1, as the runbook says.
func restoreDocExample(t *testing.T, md string, endpoints []string) {
	tmp := t.TempDir()
	dataDir := filepath.Join(tmp, "restored")
	pairs := []string{"/backup/", tmp + "/", "/var/lib/leased", dataDir}
	for k, a := range proc.FreeAddrs(t, 3) {
		pairs = append(pairs, fmt.Sprintf("10.0.1.%d:7201", k+1), a)
	}
	subst := strings.NewReplacer(pairs...)
	dir := shellDir(t)
	env := "LEASECTL_ENDPOINTS=" + strings.Join(endpoints, ",")

	save := strings.TrimSpace(docBlock(t, md, "", "leasectl snapshot save "))
	runShellIn(t, dir, subst.Replace(save), env)

	restore, shown := shellExample(docBlock(t, md, "", "$ leasectl snapshot restore "))
	cmd := subst.Replace(restore)
	if strings.Contains(cmd, "10.0.1.") || strings.Contains(cmd, "/var/") || strings.Contains(cmd, "/backup/") {
		t.Fatalf("docs/operations.md: the restore uses an address or path the test does not know: %s", restore)
	}
	out := runShellIn(t, dir, cmd, env)
	lines := strings.Split(out, "\n")
	for _, s := range shown {
		s = subst.Replace(s)
		if !slices.ContainsFunc(lines, func(got string) bool { return sameFields(s, got) }) {
			t.Errorf("docs/operations.md: %s\nshows %q; no line of its output has its fields:\n%s", restore, s, out)
		}
	}
	m := regexp.MustCompile(`token floor (\d+) .* --token-floor (\d+)\n(?s:.*)\n\S+\s+\S+\s+\S+\s+\S+\s+\d+\s+\d+\s+(\d+)\s+[1-9]\d*\n`).FindStringSubmatch(out)
	if m == nil || m[1] != m[2] || m[1] != m[3] {
		t.Errorf("the restore's output does not name one token floor in its message and its row, with a lease:\n%s", out)
	}

	if !strings.Contains(md, "A non-empty data dir is refused (exit 1).") {
		t.Fatal("docs/operations.md no longer says a non-empty data dir is refused: update the test")
	}
	again, err := shellOutput(dir, cmd, env)
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Errorf("the restore into its own data dir again: %v, the docs say exit 1:\n%s", err, again)
	}
}

// shellExample splits a block that shows a command ("$ " and continuation lines) and its output.
func shellExample(block string) (cmd string, shown []string) {
	lines := strings.Split(strings.TrimSuffix(strings.TrimPrefix(block, "$ "), "\n"), "\n")
	i := 0
	for i < len(lines)-1 && strings.HasSuffix(lines[i], "\\") {
		i++
	}
	return strings.Join(lines[:i+1], "\n"), lines[i+1:]
}

// hexID is a cluster or member id as leasectl prints it.
var hexID = regexp.MustCompile(`^[0-9a-f]{16}$`)

// sameFields says whether got has shown's fields: the same words, any number for a number, any 16-digit
// hex id for one.
func sameFields(shown, got string) bool {
	a, b := strings.Fields(shown), strings.Fields(got)
	if len(a) == 0 || len(a) != len(b) {
		return false
	}
	digits := regexp.MustCompile(`^\d+$`)
	for i := range a {
		if a[i] != b[i] && !(digits.MatchString(a[i]) && digits.MatchString(b[i])) &&
			!(hexID.MatchString(a[i]) && hexID.MatchString(b[i])) {
			return false
		}
	}
	return true
}

// securityACLExample parses docs/security.md's rules with the parser of --initial-acl-file and `leasectl
// acl set` and checks they are the rules the page describes, then sets them on the cluster with leasectl
// (a cluster without --client-cert-auth takes them from anyone) and reads back the same rules.
func securityACLExample(t *testing.T, md string, endpoints []string) {
	block := docBlock(t, md, "yaml", "rules:\n")
	rules, err := acl.Parse([]byte(block))
	if err != nil {
		t.Fatalf("docs/security.md's rules: %v\n%s", err, block)
	}
	var got []string
	for _, r := range rules {
		var perms []string
		for _, p := range r.GetPermissions() {
			perms = append(perms, acl.Name(p))
		}
		got = append(got, fmt.Sprintf("%s %q %s", r.GetIdentity(), r.GetPrefix(), strings.Join(perms, ",")))
	}
	want := []string{`alice "jobs/" read,lease`, `ops "" read,lease,admin`}
	if !slices.Equal(got, want) {
		t.Fatalf("docs/security.md's rules parse as %q, the page describes %q", got, want)
	}
	file := filepath.Join(t.TempDir(), "acl.yaml")
	if err := os.WriteFile(file, []byte(block), 0o600); err != nil {
		t.Fatal(err)
	}
	ctlOK(t, endpoints, "acl", "set", file)
	back, err := acl.Parse([]byte(runCLI(t, endpoints, "acl", "get")))
	if err != nil || len(back) != len(rules) {
		t.Fatalf("leasectl acl get after acl set: %v, %d rules", err, len(back))
	}
	for i := range rules {
		if !proto.Equal(rules[i], back[i]) {
			t.Errorf("rule %d set as %v, read back as %v", i, rules[i], back[i])
		}
	}
}

// logfmtKey is a key of a text log line: key=value, key="quoted value" or key= (empty).
var logfmtKey = regexp.MustCompile(`(?:^|\s)([A-Za-z_][\w.]*)=(?:"(?:[^"\\]|\\.)*"|\S*)`)

// logKeys returns the keys of a text log line, sorted.
func logKeys(line string) []string {
	var keys []string
	for _, m := range logfmtKey.FindAllStringSubmatch(line, -1) {
		keys = append(keys, m[1])
	}
	slices.Sort(keys)
	return keys
}

// auditDocExample checks the audit trail's sample lines against the lines the nodes wrote to stderr (the
// default --audit-log) for the grant and the ACL change this test made (if aclSet): the same message and
// keys, values aside. The admin release needs identities (--client-cert-auth): auditAdminReleaseExample
// checks it on the TLS cluster.
func auditDocExample(t *testing.T, md string, nodes []*proc.Node, aclSet bool) {
	var logs []string
	for _, n := range nodes {
		logs = append(logs, n.LogPath)
	}
	var checked []string
	for _, sample := range auditSamples(t, md) {
		event := auditEvent(sample)
		if event == "admin-release" || (event == "acl-set" && !aclSet) {
			continue
		}
		checkAuditSample(t, sample, logs)
		checked = append(checked, event)
	}
	if !slices.Contains(checked, "granted") {
		t.Fatalf("docs/operations.md: checked the audit samples %q, none for a grant: the samples were not found", checked)
	}
}

// auditAdminReleaseExample checks the sample of an admin's release against the TLS cluster of
// TestDocTLSExamplesRun (client certificates in certs, ACL of scripts/acl.example.yaml): alice takes a
// lease, ops releases it, and the leader's line has the sample's keys.
func auditAdminReleaseExample(t *testing.T, md, certs string, c *cluster) {
	var sample string
	for _, s := range auditSamples(t, md) {
		if auditEvent(s) == "admin-release" {
			sample = s
		}
	}
	if sample == "" {
		t.Fatal("docs/operations.md has no audit sample of an admin's release: update the test")
	}
	as := func(identity string, args ...string) string {
		f := func(p string) string { return filepath.Join(certs, p) }
		return runCLI(t, c.Endpoints(), append([]string{"--cacert", f("ca.crt"), "--cert", f(identity + ".crt"), "--key", f(identity + ".key")}, args...)...)
	}
	var lease struct {
		Token uint64 `json:"token"`
	}
	if out := as("alice", "acquire", "jobs/audit", "--ttl", "30s", "-o", "json"); json.Unmarshal([]byte(out), &lease) != nil || lease.Token == 0 {
		t.Fatalf("leasectl acquire -o json printed no token: %s", out)
	}
	as("ops", "release", "jobs/audit", "--token", fmt.Sprint(lease.Token))
	var logs []string
	for _, n := range c.Nodes {
		logs = append(logs, n.LogPath)
	}
	checkAuditSample(t, sample, logs)
}

// auditSamples returns the sample lines of docs/operations.md's "Audit trail".
func auditSamples(t *testing.T, md string) []string {
	t.Helper()
	var samples []string
	for s := range strings.Lines(docBlock(t, md, "", "level=INFO ")) {
		if auditEvent(s) == "" {
			t.Fatalf("docs/operations.md: an audit sample without an event: %s", s)
		}
		samples = append(samples, strings.TrimSpace(s))
	}
	return samples
}

// auditEvent is the event an audit line is about, "" if none.
func auditEvent(line string) string {
	if m := regexp.MustCompile(`\bevent=(\S+)`).FindStringSubmatch(line); m != nil {
		return m[1]
	}
	return ""
}

// checkAuditSample waits for an info line with sample's message and event in one of the logs, and checks
// that it has the sample's keys; the samples leave out the time every log line starts with.
func checkAuditSample(t *testing.T, sample string, logs []string) {
	t.Helper()
	msg := regexp.MustCompile(`\bmsg="[^"]*"`).FindString(sample)
	event := auditEvent(sample)
	var real string
	err := proc.Poll(10*time.Second, func() bool {
		for _, path := range logs {
			log, _ := os.ReadFile(path)
			for line := range bytes.Lines(log) {
				if s := string(line); strings.Contains(s, " event="+event+" ") && strings.Contains(s, msg) && strings.Contains(s, "level=INFO") &&
					!strings.Contains(s, " replayed=true") { // a new leader's copy of a line has that key too
					real = strings.TrimSpace(s)
					return true
				}
			}
		}
		return false
	})
	if err != nil {
		t.Fatalf("no node logged an audit line %s event=%s: %v", msg, event, err)
	}
	want := logKeys(sample)
	got := slices.DeleteFunc(logKeys(real), func(k string) bool { return k == "time" })
	if !slices.Equal(got, want) {
		t.Errorf("docs/operations.md's audit sample has the keys %v, a real line %v:\nshown: %s\nreal:  %s", want, got, sample, real)
	}
}

// TestPrometheusDocConfig checks docs/operations.md's Prometheus configuration: it parses as YAML with
// only the keys Prometheus knows there, scrapes the job leased on three admin ports, and its rule file is
// a copy of deploy/prometheus/alerts.yaml, whose alerts name that job. With promtool on PATH (as
// scripts/promtool.sh installs it) `promtool check config` takes it too, the rule file being the repo's.
func TestPrometheusDocConfig(t *testing.T) {
	const rules = "deploy/prometheus/alerts.yaml"
	block := docBlock(t, readDoc(t, "docs/operations.md"), "yaml", "scrape_configs:\n")
	var cfg struct {
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
		RuleFiles []string `yaml:"rule_files"`
	}
	dec := yaml.NewDecoder(strings.NewReader(block))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		t.Fatalf("docs/operations.md's Prometheus configuration: %v\n%s", err, block)
	}
	if len(cfg.ScrapeConfigs) != 1 || cfg.ScrapeConfigs[0].JobName != "leased" || len(cfg.ScrapeConfigs[0].StaticConfigs) != 1 ||
		len(cfg.ScrapeConfigs[0].StaticConfigs[0].Targets) != 3 {
		t.Fatalf("docs/operations.md's Prometheus configuration does not scrape three targets as job leased: %+v", cfg)
	}
	for _, target := range cfg.ScrapeConfigs[0].StaticConfigs[0].Targets {
		if !strings.HasSuffix(target, ":7401") {
			t.Errorf("scrape target %s is not an admin port (7401) of docs/operations.md's nodes", target)
		}
	}
	if len(cfg.RuleFiles) != 1 || filepath.Base(cfg.RuleFiles[0]) != filepath.Base(rules) || !strings.Contains(block, "# a copy of "+rules+"\n") {
		t.Fatalf("docs/operations.md's rule_files is not a copy of %s: %q", rules, cfg.RuleFiles)
	}
	if !strings.Contains(readDoc(t, rules), `job="leased"`) {
		t.Fatalf("%s does not name the job leased", rules)
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Log("promtool not found: the configuration was only parsed")
		return
	}
	abs, err := filepath.Abs(filepath.Join("..", "..", rules))
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "prometheus.yml")
	if err := os.WriteFile(file, []byte(strings.ReplaceAll(block, cfg.RuleFiles[0], abs)), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "config", file).CombinedOutput(); err != nil {
		t.Errorf("promtool check config on docs/operations.md's configuration: %v\n%s", err, out)
	}
}
