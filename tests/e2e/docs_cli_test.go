package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leased/leased/tests/internal/proc"
)

// The leasectl examples of docs/leasectl.md and the README run as written, with three exceptions: the
// address the docs show (or elide as "leasectl ...") becomes the test cluster's, a benchmark but failover
// runs for 2 s rather than the docs' 5 or 10, and the reader's own programs (./transcode,
// /usr/local/bin/compact, ./backup.sh) are stubs that print the token leasectl handed them. A shown output
// varies from run to run, so it is checked for its shape: every line the docs show matches a line of the
// output with each number, time or duration taken as any other.

// cronSchedule is the five time fields before a crontab line's command.
var cronSchedule = regexp.MustCompile(`^(?:[*0-9/,-]+\s+){5}`)

// placeholder marks a synopsis rather than an example: an upper-case word (RESOURCE, D), an option in
// brackets, or alternatives.
var placeholder = regexp.MustCompile(`\b[A-Z][A-Z_]*\b|[\[|]`)

// docExample is an example command of a page and the output lines it shows for it (blank lines left out).
type docExample struct {
	cmd   string
	shown []string
}

// leasectlExamples returns the concrete leasectl commands of blocks: the "$ leasectl" lines with the output
// shown after each, and the lines that are a leasectl command with no placeholder (a crontab line's
// command too), with no output shown.
func leasectlExamples(blocks []string) []docExample {
	var exs []docExample
	for _, block := range blocks {
		var cur *docExample
		for line := range strings.Lines(block) {
			line = strings.TrimRight(line, "\n")
			cmd, prompted := strings.CutPrefix(line, "$ ")
			if !prompted {
				cmd = cronSchedule.ReplaceAllString(line, "")
				cmd, _, _ = strings.Cut(cmd, "#")
				cmd = strings.TrimSpace(cmd)
			}
			switch {
			case prompted || strings.HasPrefix(cmd, "leasectl ") && !placeholder.MatchString(cmd):
				exs = append(exs, docExample{cmd: strings.TrimSpace(cmd)})
				cur = &exs[len(exs)-1]
				if !prompted {
					cur = nil // a synopsis-style line shows no output
				}
			case cur != nil && strings.TrimSpace(line) != "":
				cur.shown = append(cur.shown, line)
			}
		}
	}
	return exs
}

// docDuration is a benchmark's --duration, which the test shortens.
var docDuration = regexp.MustCompile(`--duration \S+`)

// stubPrograms makes an executable stub in dir for every program of the reader's that script runs (a word
// after " -- " that starts with ./ or /), and returns script with absolute paths pointing at the stubs.
// A stub prints "NAME ran with LEASE_TOKEN=T".
func stubPrograms(t *testing.T, dir, script string) string {
	t.Helper()
	for _, m := range regexp.MustCompile(` -- (\.?/\S+)`).FindAllStringSubmatch(script, -1) {
		name := filepath.Base(m[1])
		stub := "#!/bin/sh\necho \"" + name + " ran with LEASE_TOKEN=$LEASE_TOKEN\"\n"
		if err := os.WriteFile(filepath.Join(dir, name), []byte(stub), 0o755); err != nil {
			t.Fatal(err)
		}
		script = strings.ReplaceAll(script, " -- "+m[1], " -- ./"+name)
	}
	return script
}

// runLeasectlExamples runs every concrete leasectl example of docs/leasectl.md against c (see the comment
// at the top of this file). A `bench failover` example gets what the docs say its run had: its leader is
// SIGSTOPped for 2 s a second into the run.
func runLeasectlExamples(t *testing.T, c *cluster, md string) {
	eps := strings.Join(c.Endpoints(), ",")
	exs := leasectlExamples(codeBlocks(md, ""))
	benches := 0
	for _, ex := range exs {
		cmd := regexp.MustCompile(`^leasectl (--endpoints \S+|\.\.\.) `).ReplaceAllString(ex.cmd, "leasectl ")
		cmd = strings.Replace(cmd, "leasectl ", "leasectl --endpoints "+eps+" ", 1)
		failover := strings.Contains(cmd, "bench failover")
		if !failover {
			cmd = docDuration.ReplaceAllString(cmd, "--duration 2s")
		}
		if strings.Contains(cmd, " bench ") {
			benches++
		}
		dir := shellDir(t)
		script := stubPrograms(t, dir, cmd)
		out := runExample(t, c, dir, script, ex, failover)
		t.Logf("$ %s\n%s", cmd, out)
		checkShape(t, "docs/leasectl.md", ex, out)
		if strings.Contains(script, " run ") && !regexp.MustCompile(`ran with LEASE_TOKEN=[1-9]`).MatchString(out) {
			t.Errorf("docs/leasectl.md: %s\ndid not run its command with a token:\n%s", cmd, out)
		}
	}
	if len(exs) < 8 || benches < 5 {
		t.Fatalf("docs/leasectl.md: found %d examples, %d of them benchmarks: the examples were not found", len(exs), benches)
	}
}

// runExample runs an example's script in dir and returns its output; a failover example with its leader
// paused (withLeaderPaused). A benchmark loads a cluster hard enough for a loaded machine to lose its
// leader meanwhile, which fails some of its operations (and the example's exit status or shape): one that
// fails is run once more on a cluster with a leader, and fails the test only if it fails again.
func runExample(t *testing.T, c *cluster, dir, script string, ex docExample, failover bool) string {
	t.Helper()
	run := func() (string, error) {
		if !failover {
			return shellOutput(dir, script)
		}
		var out string
		var err error
		withLeaderPaused(c, time.Second, 2*time.Second, func() { out, err = shellOutput(dir, script) })
		return out, err
	}
	out, err := run()
	if strings.Contains(script, " bench ") && (err != nil || !shapesMatch(ex, out)) {
		t.Logf("%s: %v, output:\n%s\nrunning it again once the cluster has a leader", ex.cmd, err, out)
		c.waitLeader(10*time.Second, -1)
		out, err = run()
	}
	if err != nil {
		t.Fatalf("the example failed: %v\n%s\n--- the script:\n%s", err, out, script)
	}
	return out
}

// shapesMatch says whether every line ex shows has a line of out of its shape (checkShape).
func shapesMatch(ex docExample, out string) bool {
	lines := strings.Split(out, "\n")
	for _, shown := range ex.shown {
		if !slices.ContainsFunc(lines, func(got string) bool { return sameShape(shown, got) }) {
			return false
		}
	}
	return true
}

// withLeaderPaused runs f while, after the given delay, the cluster's leader is SIGSTOPped for pause. The
// leader is resumed before it returns, whatever f does.
func withLeaderPaused(c *cluster, delay, pause time.Duration, f func()) {
	leader, _ := c.waitLeader(10*time.Second, -1)
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		select {
		case <-done:
			return
		case <-time.After(delay):
		}
		c.Signal(leader, syscall.SIGSTOP)
		defer c.Signal(leader, syscall.SIGCONT)
		select {
		case <-done:
		case <-time.After(pause):
		}
	}()
	defer func() {
		close(done)
		<-stopped
	}()
	f()
}

// number is a number, a time or a duration of an output: 42, 3.5, 1.682s, 155ms, 2026-12-01T21:11:58.953Z,
// 127.0.0.1:7101.
var number = regexp.MustCompile(`\d[\d.,:TZ-]*(?:(?:µs|ms|ns|h|m|s)(?:\d[\d.]*(?:µs|ms|ns|h|m|s))*)?`)

// shapeOf is a pattern of a shown line: its words as shown, any number for each number, any spacing.
func shapeOf(line string) *regexp.Regexp {
	var re strings.Builder
	re.WriteString(`^\s*`)
	last := 0
	for _, loc := range number.FindAllStringIndex(line, -1) {
		re.WriteString(spaced(line[last:loc[0]]))
		re.WriteString(`-?\d[\d.,:TZ-]*(?:[µnmsh]{1,2}(?:\d[\d.]*[µnmsh]{1,2})*)?`)
		last = loc[1]
	}
	re.WriteString(spaced(line[last:]))
	re.WriteString(`\s*$`)
	return regexp.MustCompile(re.String())
}

// spaced quotes s for a pattern, any run of spaces matching any spacing.
func spaced(s string) string {
	var b strings.Builder
	for i, part := range regexp.MustCompile(`\s+`).Split(s, -1) {
		if i > 0 {
			b.WriteString(`\s+`)
		}
		b.WriteString(regexp.QuoteMeta(part))
	}
	return b.String()
}

// checkShape fails t unless every line ex shows has a line of out of its shape: a JSON object with the
// same keys (nested ones too), any other line as shapeOf says.
func checkShape(t *testing.T, doc string, ex docExample, out string) {
	t.Helper()
	lines := strings.Split(out, "\n")
	for _, shown := range ex.shown {
		if !slices.ContainsFunc(lines, func(got string) bool { return sameShape(shown, got) }) {
			t.Errorf("%s: %s\nshows %q; no line of its output has that shape:\n%s", doc, ex.cmd, shown, out)
		}
	}
}

// sameShape says whether got has the shape of shown.
func sameShape(shown, got string) bool {
	var a, b any
	if strings.HasPrefix(shown, "{") && json.Unmarshal([]byte(shown), &a) == nil {
		return json.Unmarshal([]byte(got), &b) == nil && keysOf(a) == keysOf(b)
	}
	return shapeOf(shown).MatchString(got)
}

// keysOf spells the keys of a decoded JSON value, nested objects and an array's first element included.
func keysOf(v any) string {
	switch v := v.(type) {
	case map[string]any:
		keys := slices.Sorted(func(yield func(string) bool) {
			for k := range v {
				if !yield(k) {
					return
				}
			}
		})
		var s strings.Builder
		for _, k := range keys {
			fmt.Fprintf(&s, "%s:%s,", k, keysOf(v[k]))
		}
		return "{" + s.String() + "}"
	case []any:
		if len(v) > 0 {
			return "[" + keysOf(v[0]) + "]"
		}
		return "[]"
	}
	return ""
}

// runReadmeExamples runs the README's shell block against the cluster: every line but `make build` (the
// test's leasectl is that build), as leasectlExamples' comment says.
func runReadmeExamples(t *testing.T, md string, endpoints, httpAddrs []string) {
	ran := 0
	for _, block := range codeBlocks(md, "sh") {
		if !strings.Contains(block, "bin/leasectl ") {
			continue
		}
		script := regexp.MustCompile(`(?m)^make build.*\n`).ReplaceAllString(block, "")
		script = docDuration.ReplaceAllString(script, "--duration 2s")
		for i, a := range httpAddrs {
			script = strings.ReplaceAll(script, fmt.Sprintf("%s%d", docHTTPAddr, i+1), a)
		}
		dir := shellDir(t)
		script = stubPrograms(t, dir, script)
		out := runShellIn(t, dir, script, "LEASECTL_ENDPOINTS="+strings.Join(endpoints, ","))
		for _, want := range []string{
			`(?m)^reports/daily\s+\S+\s+[1-9]`,                // acquire's row
			`backup.sh ran with LEASE_TOKEN=[1-9]`,            // run's command
			`encode.sh ran with LEASE_TOKEN=[1-9]`,            // the semaphore's
			`(?m)^NAME\s+ID\s+ADDRESS\s+ROLE`,                 // status
			`(?m)^acquire\s+64\s+[0-9.]+s\s+[1-9]`,            // bench
			`"lease":\s*\{"resource":\s*"jobs/a",\s*"holder"`, // curl
		} {
			if !regexp.MustCompile(want).MatchString(out) {
				t.Errorf("README.md: the shell examples' output does not match %s:\n%s\n--- the script:\n%s", want, out, script)
			}
		}
		ran++
	}
	if ran == 0 {
		t.Error("README.md: no shell block with bin/leasectl found")
	}
}

// grpcurlBin is the grpcurl the docs' examples run with: $LEASED_TEST_GRPCURL (scripts/test.sh installs
// a pinned one), else grpcurl on PATH. Without one t is skipped, loudly, except under CI=true.
func grpcurlBin(t *testing.T) string {
	if p := os.Getenv("LEASED_TEST_GRPCURL"); p != "" {
		return p
	}
	if p, err := exec.LookPath("grpcurl"); err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("grpcurl not found (LEASED_TEST_GRPCURL or PATH): scripts/test.sh installs it")
	}
	t.Skip("SKIPPED: grpcurl not found (LEASED_TEST_GRPCURL or PATH); scripts/test.sh installs it, or: " +
		"go install github.com/fullstorydev/grpcurl/cmd/grpcurl@" + grpcurlVersion)
	return ""
}

// grpcurlVersion is the grpcurl scripts/test.sh installs.
const grpcurlVersion = "v1.9.4"

// runGrpcurlExamples runs the grpcurl commands of docs/operations.md's ```sh blocks against the cluster
// (the docs' 127.0.0.1:710N are its client addresses); every line shown after a command must be a line
// of its output.
func runGrpcurlExamples(t *testing.T, md string, endpoints []string) {
	bin := grpcurlBin(t)
	ran := 0
	for _, block := range codeBlocks(md, "sh") {
		var cur *docExample
		var exs []docExample
		for line := range strings.Lines(block) {
			line = strings.TrimRight(line, "\n")
			if strings.HasPrefix(line, "grpcurl ") {
				exs = append(exs, docExample{cmd: line})
				cur = &exs[len(exs)-1]
			} else if cur != nil && strings.TrimSpace(line) != "" && !strings.HasPrefix(line, "#") {
				cur.shown = append(cur.shown, line)
			}
		}
		for _, ex := range exs {
			cmd := ex.cmd
			for i, ep := range endpoints {
				cmd = strings.ReplaceAll(cmd, fmt.Sprintf("127.0.0.1:710%d", i+1), ep)
			}
			cmd = bin + strings.TrimPrefix(cmd, "grpcurl")
			out := runShell(t, cmd)
			for _, want := range ex.shown {
				if !slices.Contains(strings.Split(out, "\n"), want) {
					t.Errorf("docs/operations.md: %s\nshows %q, which its output lacks:\n%s", ex.cmd, want, out)
				}
			}
			ran++
		}
	}
	if ran < 2 {
		t.Fatalf("docs/operations.md: ran %d grpcurl examples: the examples were not found", ran)
	}
}

// TestDocTLSExamplesRun runs docs/http.md's and docs/security.md's examples with TLS and client
// certificates against a cluster
// set up as `scripts/cluster.sh --tls` sets it up: certificates from scripts/certs.sh, client
// certificates required, the ACL of scripts/acl.example.yaml, the default timing. It also checks what
// the page says of a client without a certificate (curl exits 56) and of plain http:// to the HTTPS port
// (400), and docs/operations.md's audit sample of an admin's release (auditAdminReleaseExample).
func TestDocTLSExamplesRun(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test: skipped with -short")
	}
	certs := filepath.Join(t.TempDir(), "certs")
	if out, err := exec.Command("../../scripts/certs.sh", certs).CombinedOutput(); err != nil {
		t.Fatalf("scripts/certs.sh: %v\n%s", err, out)
	}
	acl, err := filepath.Abs("../../scripts/acl.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	httpAddrs := proc.FreeAddrs(t, 3)
	c := newClusterWith(t, proc.Config{Size: 3, Args: defaultTiming, ClientTLS: certsClientTLS(t, certs, "ops"),
		NodeArgs: func(i int) []string {
			name := fmt.Sprintf("n%d", i+1)
			f := func(p string) string { return filepath.Join(certs, p) }
			return []string{"--http-addr=" + httpAddrs[i],
				"--cert-file=" + f(name+".crt"), "--key-file=" + f(name+".key"), "--trusted-ca-file=" + f("ca.crt"),
				"--client-cert-auth", "--peer-cert-file=" + f("peer/"+name+".crt"), "--peer-key-file=" + f("peer/"+name+".key"),
				"--peer-trusted-ca-file=" + f("peer-ca.crt"), "--peer-cert-allowed-cn=n1,n2,n3", "--initial-acl-file=" + acl}
		}})
	md := readDoc(t, "docs/http.md")
	httpTLSDocExamples(t, md, certs, httpAddrs)
	securityDocExamples(t, readDoc(t, "docs/security.md"), certs, c.Endpoints())
	auditAdminReleaseExample(t, readDoc(t, "docs/operations.md"), certs, c)

	// The prose after the examples.
	if !strings.Contains(md, "Without a client certificate the TLS handshake fails (curl exits 56); plain `http://` to the HTTPS port\nanswers 400.") {
		t.Fatal("docs/http.md no longer says what a client without a certificate gets: update the test")
	}
	url := "https://" + httpAddrs[0] + "/v1/leases/jobs/a"
	noCert := exec.Command("curl", "-s", "--cacert", filepath.Join(certs, "ca.crt"), url)
	if out, _ := noCert.CombinedOutput(); noCert.ProcessState.ExitCode() != 56 {
		t.Errorf("curl without a client certificate: exit %d, %q; docs/http.md says 56", noCert.ProcessState.ExitCode(), out)
	}
	if out := runShell(t, "curl -s -w ' %{http_code}\\n' http://"+httpAddrs[0]+"/v1/leases/jobs/a"); !strings.HasSuffix(out, " 400\n") {
		t.Errorf("plain http:// to the HTTPS port answered %q; docs/http.md says 400", out)
	}
}

// certsClientTLS is the TLS configuration of a client with scripts/certs.sh's certificate for identity.
func certsClientTLS(t *testing.T, certs, identity string) *tls.Config {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(filepath.Join(certs, identity+".crt"), filepath.Join(certs, identity+".key"))
	if err != nil {
		t.Fatal(err)
	}
	pem, err := os.ReadFile(filepath.Join(certs, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		t.Fatal("scripts/certs.sh's ca.crt holds no certificate")
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: roots, MinVersion: tls.VersionTLS12}
}

// httpTLSDocExamples runs the curl commands of docs/http.md's ```sh blocks that use client certificates
// (--cacert), with data/certs/ replaced by certs and the docs' https://127.0.0.1:750N by the cluster's
// HTTP addresses. A command must answer the HTTP status it shows (else 200), and a comment after it that
// quotes part of its answer ("# ... X ...") must be in it.
func httpTLSDocExamples(t *testing.T, md, certs string, httpAddrs []string) {
	ran := 0
	for _, block := range codeBlocks(md, "sh") {
		if !strings.Contains(block, "--cacert") {
			continue
		}
		cmds := curlCommand.FindAllStringIndex(block, -1)
		for k, loc := range cmds {
			cmd := block[loc[0]:loc[1]]
			end := len(block)
			if k+1 < len(cmds) {
				end = cmds[k+1][0]
			}
			after := block[loc[1]:end]
			want := "200"
			if m := shownStatus.FindStringSubmatch(after); m != nil {
				want = m[1]
			}
			cmd = strings.ReplaceAll(cmd, "data/certs/", certs+"/")
			for i, a := range httpAddrs {
				cmd = strings.ReplaceAll(cmd, fmt.Sprintf("%s%d", docHTTPAddr, i+1), a)
			}
			if !strings.Contains(cmd, "-w ") {
				cmd += ` -w ' %{http_code}\n'`
			}
			out := runShell(t, cmd)
			if got := shownStatus.FindStringSubmatch(out); got == nil || got[1] != want {
				t.Errorf("docs/http.md: %s\nanswered %s, want HTTP status %s", cmd, out, want)
			}
			checkShownAnswer(t, cmd, after, out)
			for _, m := range regexp.MustCompile(`(?m)^# \.\.\. (.+) \.\.\.$`).FindAllStringSubmatch(after, -1) {
				if !strings.Contains(out, m[1]) {
					t.Errorf("docs/http.md: %s\nanswered %s, which lacks %s", cmd, out, m[1])
				}
			}
			ran++
		}
	}
	if ran < 2 {
		t.Fatalf("docs/http.md: ran %d TLS curl examples: the examples were not found", ran)
	}
}

// checkShownAnswer checks the answer docs/http.md shows after a curl command (the lines up to the next
// comment or blank line), when it is whole JSON (not elided with […]) and then perhaps its HTTP status:
// the command's answer must have the same keys, nested ones too.
func checkShownAnswer(t *testing.T, cmd, after, out string) {
	t.Helper()
	var shown strings.Builder
	for line := range strings.Lines(strings.TrimLeft(after, "\n")) {
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			break
		}
		shown.WriteString(strings.TrimSpace(line))
	}
	var want, got any
	if json.Unmarshal([]byte(shownStatus.ReplaceAllString(shown.String()+"\n", "}")), &want) != nil {
		return // no answer shown, or an elided one
	}
	answer := shownStatus.ReplaceAllString(out, "}")
	if err := json.Unmarshal([]byte(answer), &got); err != nil || keysOf(got) != keysOf(want) {
		t.Errorf("docs/http.md: %s\nanswered %s, which has other fields than the answer shown:\n%s", cmd, out, shown.String())
	}
}

// shownExit is the exit status a docs example shows in its comment: "# exit 6: ...".
var shownExit = regexp.MustCompile(`#\s*exit (\d+)`)

// securityDocExamples runs the leasectl commands of docs/security.md's ```sh blocks against the TLS
// cluster (its endpoints; data/certs/ is certs): each must exit with the status its comment shows, else 0.
// `scripts/cluster.sh --tls` is what the test's cluster stands in for.
func securityDocExamples(t *testing.T, md, certs string, endpoints []string) {
	ran := 0
	for _, block := range codeBlocks(md, "sh") {
		for line := range strings.Lines(block) {
			line = strings.TrimSpace(line)
			if !strings.HasPrefix(line, "leasectl ") {
				continue
			}
			want := 0
			if m := shownExit.FindStringSubmatch(line); m != nil {
				want, _ = strconv.Atoi(m[1])
			}
			cmd := strings.ReplaceAll(line, "data/certs/", certs+"/")
			out, err := shellOutput(shellDir(t), cmd, "LEASECTL_ENDPOINTS="+strings.Join(endpoints, ","))
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != want {
				t.Errorf("docs/security.md: %s\nexited %d, the docs show %d:\n%s", line, code, want, out)
			}
			ran++
		}
	}
	if ran < 2 {
		t.Fatalf("docs/security.md: ran %d leasectl examples: the examples were not found", ran)
	}
}
