// Command leasectl is the operator's and scripter's CLI for leased: take, renew and release leases, read and
// watch them, turn any command into a singleton (run) or a leader (elect), and look at the cluster (status,
// member, snapshot).
//
// The contract scripts rely on — flags, output shapes and exit codes — is documented in docs/leasectl.md.
// main only wires the process to run; run (and every subcommand) takes its streams as parameters, so the
// tests drive the CLI in-process as well as through the built binary.
package main

import (
	"context"
	"io"
	"os"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run executes one leasectl invocation and returns its exit code. It is the only place errors become exit
// codes (exitCode) and the only place they are printed (reportError).
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr, getenv: os.Getenv, signals: osSignals}
	root := a.rootCommand()
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err != nil && !a.ran {
		// Cobra failed before any command body ran: a bad flag, argument or command name.
		path := root.CommandPath()
		if cmd, _, ferr := root.Find(args); ferr == nil {
			path = cmd.CommandPath()
		}
		err = asUsage(err, path)
	}
	code := exitCode(err)
	if err != nil && !isQuiet(err) {
		a.reportError(err, code, root)
	}
	return code
}
