package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// bin is the leasectl binary built once for the end-to-end tests.
var bin string

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() { // no binary: the tests that run it skip (ctl)
		goleak.VerifyTestMain(m)
		return
	}
	dir, err := os.MkdirTemp("", "leasectl-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "leasectl")
	gocmd := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(gocmd); err != nil {
		gocmd = "go"
	}
	build := exec.Command(gocmd, "build", "-o", bin, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build leasectl:", err)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		_ = os.RemoveAll(dir)
		os.Exit(code)
	}))
}

// result is one leasectl invocation's outcome.
type result struct {
	code           int
	stdout, stderr string
	elapsed        time.Duration
}

func (r result) String() string {
	return fmt.Sprintf("exit %d after %v\nstdout: %s\nstderr: %s", r.code, r.elapsed, r.stdout, r.stderr)
}

// ctl runs the built binary against endpoints, bounded by 30s. Under -short there is no binary, and t
// is skipped: the inner loop (make test-short) starts no process.
func ctl(t *testing.T, endpoints []string, args ...string) result {
	t.Helper()
	if bin == "" {
		t.Skip("runs the leasectl binary: skipped under -short (make test-short); make test runs it")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"--endpoints", strings.Join(endpoints, ",")}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String(), elapsed: time.Since(start)}
	if cmd.ProcessState == nil {
		t.Fatalf("leasectl %v: %v", args, err)
	}
	r.code = cmd.ProcessState.ExitCode()
	return r
}

// inProcess runs leasectl's run function in this process.
func inProcess(args ...string) result {
	var out, errb bytes.Buffer
	start := time.Now()
	code := run(context.Background(), args, strings.NewReader(""), &out, &errb)
	return result{code: code, stdout: out.String(), stderr: errb.String(), elapsed: time.Since(start)}
}
