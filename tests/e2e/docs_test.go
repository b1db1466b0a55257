package e2e

import (
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leased/leased/server"
	"github.com/leased/leased/tests/internal/proc"
)

// The docs' examples assume the local cluster of scripts/cluster.sh: these addresses, and the default
// timing (so the default TTL floor of 8 s; defaultTiming gives proc's nodes that timing).
const (
	docEndpoints = `[]string{"127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"}`
	docHTTPAddr  = "127.0.0.1:750" // + the node's number, 1..3
)

// TestDocExamplesRun does what docs/quickstart.md tells a newcomer to do, against a three-node cluster
// with the default timing and an HTTP/JSON port on every node: it runs the page's Go program (go run,
// against this module) and every ```sh block in order in one shell, with the page's addresses replaced by
// the cluster's. The ```text blocks (install, scripts/cluster.sh on its fixed ports, go mod) are not run:
// the cluster here is started the way scripts/cluster.sh starts it, on free ports. Then it runs the curl
// commands of docs/http.md's examples against the same cluster (see httpDocExamples; the TLS ones:
// TestDocTLSExamplesRun), runs the README's commands (readmeExamples) and docs/operations.md's grpcurl
// commands (runGrpcurlExamples), checks docs/leasectl.md's synopses and refusals (leasectlDocExamples)
// and runs its examples (runLeasectlExamples).
func TestDocExamplesRun(t *testing.T) {
	md := readDoc(t, "docs/quickstart.md")
	httpAddrs := proc.FreeAddrs(t, 3)
	c := newClusterWith(t, proc.Config{Size: 3, Args: defaultTiming, NodeArgs: func(i int) []string {
		return []string{"--http-addr=" + httpAddrs[i]}
	}})
	endpoints := c.Endpoints()

	t.Run("go", func(t *testing.T) {
		var program string
		for _, b := range codeBlocks(md, "go") {
			if strings.HasPrefix(b, "package main\n") {
				program = b
			}
		}
		if !strings.Contains(program, docEndpoints) {
			t.Fatalf("docs/quickstart.md has no Go program (package main) with the endpoints %s", docEndpoints)
		}
		mod := regexp.MustCompile(`(?m)^module (\S+)$`).FindStringSubmatch(readDoc(t, "go.mod"))
		if mod == nil || !strings.Contains(md, "go get "+mod[1]+"/client\n") {
			t.Errorf("docs/quickstart.md does not say `go get <this module>/client` (go.mod: %v)", mod)
		}
		program = strings.Replace(program, docEndpoints, fmt.Sprintf("%#v", endpoints), 1)
		out := goRun(t, program)
		for _, want := range []string{
			`(?m)^acquired reports/daily, token [1-9][0-9]*$`,
			`(?m)^fenced write: <nil>$`,
			`(?m)^write with an older token refused: true$`,
		} {
			if !regexp.MustCompile(want).MatchString(out) {
				t.Errorf("the quickstart program's output does not match %s:\n%s", want, out)
			}
		}
	})

	t.Run("sh", func(t *testing.T) {
		script := strings.Join(codeBlocks(md, "sh"), "\n")
		for i, a := range httpAddrs {
			script = strings.ReplaceAll(script, fmt.Sprintf("%s%d", docHTTPAddr, i+1), a)
		}
		if strings.Contains(script, docHTTPAddr) || !strings.Contains(script, "curl") || !strings.Contains(script, "bin/leasectl") {
			t.Fatalf("the quickstart's shell examples use an unknown address or lack leasectl or curl:\n%s", script)
		}
		out := runShell(t, script, "LEASECTL_ENDPOINTS="+strings.Join(endpoints, ","))
		for _, want := range []string{
			`(?m)^jobs/nightly\s+quickstart\s+[1-9]`,                                          // acquire's row
			`(?m)^holding jobs/nightly with token [1-9][0-9]*$`,                               // run's command saw LEASE_TOKEN
			`"lease":\s*\{"resource":\s*"jobs/curl",\s*"holder":\s*"sh",\s*"token":\s*"[1-9]`, // curl's acquire
			`"ttlMs":\s*"30000"\}`,                                                            // its renewal
			`"alreadyReleased":\s*false,\s*"releasedIndex":\s*"[1-9]`,                         // its release
		} {
			if !regexp.MustCompile(want).MatchString(out) {
				t.Errorf("the quickstart's shell examples' output does not match %s:\n%s", want, out)
			}
		}
	})

	t.Run("http.md", func(t *testing.T) { httpDocExamples(t, readDoc(t, "docs/http.md"), httpAddrs) })
	t.Run("README", func(t *testing.T) { readmeExamples(t, readDoc(t, "README.md"), endpoints, httpAddrs) })
	t.Run("operations.md grpcurl", func(t *testing.T) { runGrpcurlExamples(t, readDoc(t, "docs/operations.md"), endpoints) })
	t.Run("leasectl.md", func(t *testing.T) { // last: its failover example pauses the leader
		md := readDoc(t, "docs/leasectl.md")
		leasectlDocExamples(t, md, endpoints)
		runLeasectlExamples(t, c, md)
	})
}

// readDoc reads a file of the repository by its path from the repository's root.
func readDoc(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", path))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// codeBlocks returns the bodies of md's fenced code blocks whose info string is lang, in order.
func codeBlocks(md, lang string) []string {
	var blocks []string
	var cur *strings.Builder
	inside := false // a block of any language: its closing fence opens nothing
	for line := range strings.Lines(md) {
		trimmed := strings.TrimSpace(line)
		switch {
		case !inside && strings.HasPrefix(trimmed, "```"):
			inside = true
			if trimmed == "```"+lang {
				cur = &strings.Builder{}
			}
		case inside && trimmed == "```":
			if cur != nil {
				blocks = append(blocks, cur.String())
			}
			inside, cur = false, nil
		case cur != nil:
			cur.WriteString(line)
		}
	}
	return blocks
}

// goRun compiles and runs program, a package main, against this module and returns its output. It is
// written to a directory inside the module (named with a leading underscore, which `go build ./...`
// ignores) so that its imports resolve to this tree; the program runs in that directory.
func goRun(t *testing.T, program string) string {
	t.Helper()
	dir, err := os.MkdirTemp(".", "_docexample-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(program), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "run", "main.go")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go run the example: %v\n%s\n--- the program:\n%s", err, out, program)
	}
	return string(out)
}

// runShell runs script with bash -euo pipefail in a directory of its own (shellDir), with env added to
// the environment, and returns its output.
func runShell(t *testing.T, script string, env ...string) string {
	t.Helper()
	return runShellIn(t, shellDir(t), script, env...)
}

// shellDir makes a directory where bin/leasectl is the CLI under test.
func shellDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(leasectlBin, filepath.Join(dir, "bin", "leasectl")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// runShellIn is runShell in dir, whose bin/ comes first on PATH, so that a bare `leasectl` is the CLI
// under test too.
func runShellIn(t *testing.T, dir, script string, env ...string) string {
	t.Helper()
	out, err := shellOutput(dir, script, env...)
	if err != nil {
		t.Fatalf("the shell examples failed: %v\n%s\n--- the script:\n%s", err, out, script)
	}
	return out
}

// shellOutput is runShellIn's run, returning its error instead of failing a test.
func shellOutput(dir, script string, env ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), append(env, "PATH="+filepath.Join(dir, "bin")+":"+os.Getenv("PATH"))...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// exampleMarker, on the line before a ```go block (blank lines between allowed), names the Go function
// the block is an excerpt of: <!-- example: path/from/the/repository/root_test.go FuncName -->.
var exampleMarker = regexp.MustCompile(`^<!-- example: (\S+\.go) (\w+) -->$`)

// docTTL finds a TTL a Go snippet asks for in whole seconds: WithTTL(10*time.Second), TTL: 10 * time.Second.
var docTTL = regexp.MustCompile(`(?:WithTTL\(|TTL:\s*)(\d+)\s*\*\s*time\.Second`)

// TestDocGoBlocksAreExamples keeps every Go block of the README and docs/*.md runnable: a block is either
// the quick start's whole program (package main, run by TestDocExamplesRun), or marked with the example
// it is an excerpt of, and then its lines appear in that function's body, in order and contiguous, so
// the tests that compile and run the example run the block. Every TTL a block asks for must be at least
// the default cluster's TTL floor, which is what a reader's cluster refuses below.
func TestDocGoBlocksAreExamples(t *testing.T) {
	docs, err := filepath.Glob(filepath.Join("..", "..", "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	docs = append(docs, filepath.Join("..", "..", "README.md"))
	floor := server.DefaultConfig().TTLFloor()
	blocks := 0
	for _, path := range docs {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		name, _ := filepath.Rel(filepath.Join("..", ".."), path)
		for _, blk := range markedGoBlocks(string(b)) {
			blocks++
			where := fmt.Sprintf("%s:%d", name, blk.line)
			for _, m := range docTTL.FindAllStringSubmatch(blk.body, -1) {
				if ttl, _ := strconv.Atoi(m[1]); time.Duration(ttl)*time.Second < floor {
					t.Errorf("%s: %s is below the default cluster's TTL floor %v: a reader's cluster refuses it", where, m[0], floor)
				}
			}
			switch {
			case strings.HasPrefix(blk.body, "package main\n"):
				if name != filepath.Join("docs", "quickstart.md") {
					t.Errorf("%s: a whole Go program outside docs/quickstart.md, which no test runs", where)
				}
			case blk.file == "":
				t.Errorf("%s: a Go block without an <!-- example: FILE FUNC --> marker naming the example it is an excerpt of", where)
			default:
				body, err := funcBody(filepath.Join("..", "..", blk.file), blk.fn)
				if err != nil {
					t.Errorf("%s: %v", where, err)
				} else if !containsLines(body, blk.body) {
					t.Errorf("%s: the block is not an excerpt of %s in %s: the docs and the example differ\n--- block:\n%s--- %s:\n%s",
						where, blk.fn, blk.file, blk.body, blk.fn, body)
				}
			}
		}
	}
	if blocks == 0 {
		t.Fatal("no Go blocks found in the docs")
	}
}

type goBlock struct {
	line     int // of the opening fence, 1-based
	body     string
	file, fn string // from the marker; empty without one
}

// markedGoBlocks returns md's ```go blocks, each with the example marker before it, if any.
func markedGoBlocks(md string) []goBlock {
	var blocks []goBlock
	var cur *goBlock
	var body strings.Builder
	var file, fn string // the last marker, until a non-blank line other than a fence
	n := 0
	for line := range strings.Lines(md) {
		n++
		trimmed := strings.TrimSpace(line)
		switch {
		case cur == nil && trimmed == "```go":
			cur = &goBlock{line: n, file: file, fn: fn}
			body.Reset()
		case cur != nil && trimmed == "```":
			cur.body = body.String()
			blocks = append(blocks, *cur)
			cur, file, fn = nil, "", ""
		case cur != nil:
			body.WriteString(line)
		case exampleMarker.MatchString(trimmed):
			m := exampleMarker.FindStringSubmatch(trimmed)
			file, fn = m[1], m[2]
		case trimmed != "":
			file, fn = "", ""
		}
	}
	return blocks
}

// funcBody returns the body of the top-level function fn in the Go file at path, between its braces,
// with one level of indentation removed.
func funcBody(path, fn string) (string, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, parser.ParseComments)
	if err != nil {
		return "", err
	}
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && fd.Name.Name == fn && fd.Body != nil {
			inner := string(src[fset.Position(fd.Body.Lbrace).Offset+1 : fset.Position(fd.Body.Rbrace).Offset])
			var out strings.Builder
			for line := range strings.Lines(strings.TrimPrefix(inner, "\n")) {
				out.WriteString(strings.TrimPrefix(line, "\t"))
			}
			return out.String(), nil
		}
	}
	return "", fmt.Errorf("no function %s in %s", fn, path)
}

// containsLines says whether the lines of excerpt appear in body, in order and contiguous.
func containsLines(body, excerpt string) bool {
	return excerpt != "" && strings.Contains("\n"+body, "\n"+strings.TrimSuffix(excerpt, "\n")+"\n")
}

// curlCommand is a command of docs/http.md's examples: a line starting with curl, with its continuation
// lines (ending in a backslash).
var curlCommand = regexp.MustCompile(`(?m)^curl (?:.*\\\n)*.*$`)

// shownStatus is the HTTP status an example shows at the end of its answer (curl -w ' %{http_code}\n').
var shownStatus = regexp.MustCompile(`\} (\d{3})\n`)

// httpDocExamples runs every curl command of docs/http.md's ```sh blocks, in order, against the cluster
// whose HTTP addresses are httpAddrs (the docs' 127.0.0.1:7501..7503). The docs show the answers of a
// fresh local cluster, whose first grant had token 6: the commands that name that token get the token
// this cluster granted instead. An example that shows an HTTP status must answer with it; the others must
// answer 200. The blocks that need scripts/cluster.sh --tls (certificates in data/certs) are
// TestDocTLSExamplesRun's.
func httpDocExamples(t *testing.T, md string, httpAddrs []string) {
	ran := 0
	token := ""
	for _, block := range codeBlocks(md, "sh") {
		if strings.Contains(block, "--cacert") {
			continue
		}
		cmds := curlCommand.FindAllStringIndex(block, -1)
		for k, loc := range cmds {
			cmd := block[loc[0]:loc[1]]
			end := len(block)
			if k+1 < len(cmds) {
				end = cmds[k+1][0]
			}
			want := "200"
			if m := shownStatus.FindStringSubmatch(block[loc[1]:end]); m != nil {
				want = m[1]
			}
			for i, a := range httpAddrs {
				cmd = strings.ReplaceAll(cmd, fmt.Sprintf("%s%d", docHTTPAddr, i+1), a)
			}
			if token != "" {
				cmd = strings.ReplaceAll(cmd, `"token": 6}`, `"token": `+token+`}`)
			}
			if !strings.Contains(cmd, "-w ") {
				cmd += ` -w ' %{http_code}\n'`
			}
			out := runShell(t, cmd)
			if got := shownStatus.FindStringSubmatch(out); got == nil || got[1] != want {
				t.Errorf("docs/http.md: %s\nanswered %s, want HTTP status %s", cmd, out, want)
			}
			checkShownAnswer(t, cmd, block[loc[1]:end], out)
			if m := regexp.MustCompile(`"lease":\s*\{"resource":\s*"jobs/nightly",\s*"holder":\s*"[^"]*",\s*"token":\s*"(\d+)"`).FindStringSubmatch(out); m != nil && token == "" {
				token = m[1]
			}
			ran++
		}
	}
	if ran < 5 || token == "" {
		t.Fatalf("docs/http.md: ran %d curl examples, granted token %q: the examples were not found", ran, token)
	}
}

// synopsisLine is a leasectl command line of a synopsis or example: the command's words, then its
// arguments.
var synopsisLine = regexp.MustCompile(`^leasectl ((?:[a-z|]+(?: |$))+)(.*)$`)

// docRefusal is a refusal docs/leasectl.md shows for a duration flag, and the flags that provoke it.
var docRefusals = []struct{ line, args string }{
	{"leasectl: --ttl 100ms is below the cluster's minimum 8s", "acquire docs/refused --ttl 100ms"},
	{"leasectl: --lock-delay 2m0s is above the cluster's maximum 1m0s", "acquire docs/refused --ttl 10s --lock-delay 2m"},
	{"--ttl 0s must be positive, e.g. 10s", "acquire docs/refused --ttl 0"},
}

// leasectlDocExamples checks docs/leasectl.md against the CLI under test: every flag a synopsis names is
// in its command's --help, and the duration refusals it shows are what a default-timing cluster answers
// (exit 2).
func leasectlDocExamples(t *testing.T, md string, endpoints []string) {
	if checked := synopsisFlags(t, "docs/leasectl.md", codeBlocks(md, ""), endpoints); checked < 20 {
		t.Errorf("docs/leasectl.md: checked %d synopsis flags: the synopses were not found", checked)
	}
	for _, r := range docRefusals {
		if !strings.Contains(md, r.line) {
			t.Errorf("docs/leasectl.md no longer shows %q: update the test", r.line)
			continue
		}
		cmd := exec.Command(leasectlBin, append([]string{"--endpoints", strings.Join(endpoints, ",")}, strings.Fields(r.args)...)...)
		out, err := cmd.CombinedOutput()
		if code := cmd.ProcessState.ExitCode(); code != 2 || !strings.Contains(string(out), r.line) {
			t.Errorf("leasectl %s: exit %d (%v), %q; docs/leasectl.md shows exit 2 and %q", r.args, code, err, out, r.line)
		}
	}
}

// synopsisFlags checks that every flag the leasectl lines of blocks name is in its command's --help, and
// returns how many it checked; doc names the file in errors.
func synopsisFlags(t *testing.T, doc string, blocks []string, endpoints []string) int {
	t.Helper()
	checked := 0
	for _, block := range blocks {
		var words []string // of the synopsis a continuation line belongs to
		for line := range strings.Lines(block) {
			trimmed := strings.TrimPrefix(strings.TrimSpace(line), "bin/")
			var args string
			if m := synopsisLine.FindStringSubmatch(trimmed); m != nil {
				words = nil
				for _, w := range strings.Fields(m[1]) {
					words = append(words, strings.Split(w, "|")[0]) // acquire|contended|renew: acquire's help
				}
				args, _, _ = strings.Cut(m[2], " -- ") // what follows is the command leasectl runs
			} else if words != nil && strings.HasPrefix(trimmed, "[") {
				args = trimmed
			} else {
				words = nil
				continue
			}
			help := runCLI(t, endpoints, append(slices.Clone(words), "--help")...)
			for _, flag := range regexp.MustCompile(`--[a-z][a-z-]*`).FindAllString(args, -1) {
				if !strings.Contains(help, flag) {
					t.Errorf("%s: leasectl %s names %s, which its --help does not know", doc, strings.Join(words, " "), flag)
				}
				checked++
			}
		}
	}
	return checked
}

// runCLI runs leasectl against endpoints and returns its output; it fails t if leasectl fails.
func runCLI(t *testing.T, endpoints []string, args ...string) string {
	t.Helper()
	out, err := exec.Command(leasectlBin, append([]string{"--endpoints", strings.Join(endpoints, ",")}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("leasectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// readmeExamples checks the README's shell examples: the leasectl lines name only flags their commands
// know, and the block runs against the cluster (runReadmeExamples).
func readmeExamples(t *testing.T, md string, endpoints, httpAddrs []string) {
	if checked := synopsisFlags(t, "README.md", codeBlocks(md, "sh"), endpoints); checked < 5 {
		t.Errorf("README.md: checked %d leasectl flags: the examples were not found", checked)
	}
	runReadmeExamples(t, md, endpoints, httpAddrs)
}
