// Package e2e runs leased as real processes on loopback: a cluster of binaries with their own data dirs,
// killed (SIGKILL), stopped (SIGTERM) and restarted, driven through the public gRPC API and the admin HTTP
// endpoints. It checks what only whole processes can show: failover after a leader dies, recovery from
// disk after a full restart, exit codes and messages.
//
// TestMain builds cmd/leased once (set LEASED_E2E_BINARY to use a prebuilt binary instead). -short skips the
// package.
package e2e

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/leased/leased/tests/internal/proc"
)

// leasedBin is the path of the binary under test; leasectlBin the CLI's, for the tests that run it.
var leasedBin, leasectlBin string

func TestMain(m *testing.M) {
	flag.Parse()
	dir, err := os.MkdirTemp("", "leased-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cleanup := func(code int) {
		_ = os.RemoveAll(dir)
		os.Exit(code)
	}
	leasedBin = os.Getenv("LEASED_E2E_BINARY")
	if leasedBin == "" && !testing.Short() {
		if leasedBin, err = proc.Build(dir, ""); err != nil {
			fmt.Fprintln(os.Stderr, err)
			cleanup(1)
		}
	}
	if !testing.Short() {
		if leasectlBin, err = proc.BuildCommand(dir, "leasectl", ""); err != nil {
			fmt.Fprintln(os.Stderr, err)
			cleanup(1)
		}
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(cleanup))
}
