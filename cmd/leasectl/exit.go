package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/leased/leased/client"
)

// Exit codes: the contract scripts rely on (docs/leasectl.md).
const (
	exitOK          = 0
	exitError       = 1
	exitUsage       = 2
	exitHeld        = 3 // held by someone else, or another precondition failed
	exitNotFound    = 4 // no such lease, or the token is no longer the current grant
	exitUnavailable = 5 // no leader reachable, or the request timed out
	// exitAuth: the cluster refused this client: a TLS handshake failure (unknown CA, a client
	// certificate missing, expired or refused), Unauthenticated, or PermissionDenied.
	exitAuth = 6

	// exitOutcomeUnknown: a write (acquire, renew, release) reached the cluster but no answer said whether
	// it took effect; running the same command again is safe and tells.
	exitOutcomeUnknown = 7
)

// errInterrupted: leasectl received SIGINT or SIGTERM while waiting (exit 1).
var errInterrupted = errors.New("interrupted")

// usageError is a bad command line: a flag, argument or command name. It is always found before the
// network is touched (or, for limits only the server checks, reported by the server as InvalidArgument).
type usageError struct {
	err error
	cmd string // command path for the help hint
}

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usagef(cmd *cobra.Command, format string, args ...any) error {
	return &usageError{err: fmt.Errorf(format, args...), cmd: cmd.CommandPath()}
}

// asUsage marks err as a usage error of the command at path, unless it already is one.
func asUsage(err error, path string) error {
	var u *usageError
	if errors.As(err, &u) {
		return err
	}
	return &usageError{err: err, cmd: path}
}

// requireFlags reports the first of names that was not given. Cobra checks required flags only after
// PreRunE, whose checks of those flags' values would otherwise speak first.
func requireFlags(cmd *cobra.Command, names ...string) error {
	for _, n := range names {
		if !cmd.Flags().Changed(n) {
			return usagef(cmd, "--%s is required", n)
		}
	}
	return nil
}

// exitStatus sets the exit code directly: a child command's status passed through by run and elect
// (err nil: nothing is printed), or a failure to start it (126, 127 as in shells).
type exitStatus struct {
	code int
	err  error
}

func (e *exitStatus) Error() string {
	if e.err != nil {
		return e.err.Error()
	}
	return fmt.Sprintf("command exited with status %d", e.code)
}

func (e *exitStatus) Unwrap() error { return e.err }

func isQuiet(err error) bool {
	var s *exitStatus
	return errors.As(err, &s) && s.err == nil
}

// exitCode is the one place an error becomes an exit code. Wrapped errors map like the sentinel they wrap.
func exitCode(err error) int {
	var (
		usage  *usageError
		status *exitStatus
	)
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &status):
		return status.code
	case errors.As(err, &usage), errors.Is(err, client.ErrInvalid):
		return exitUsage
	case errors.Is(err, client.ErrUnauthenticated), errors.Is(err, client.ErrPermissionDenied):
		return exitAuth
	case errors.Is(err, client.ErrOutcomeUnknown): // before NotFound and Unavailable: it is neither
		return exitOutcomeUnknown
	case errors.Is(err, client.ErrHeld), errors.Is(err, client.ErrPrecondition):
		return exitHeld
	case errors.Is(err, client.ErrNotFound), errors.Is(err, client.ErrExpired), errors.Is(err, client.ErrReleased),
		errors.Is(err, client.ErrSuperseded): // an acquire --request-id whose grant already ended
		return exitNotFound
	case errors.Is(err, client.ErrUnavailable), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, client.ErrLostContact):
		return exitUnavailable
	}
	return exitError
}

// message turns an error into plain words for stderr.
func message(err error) string {
	var (
		held    *client.HeldError
		invalid *client.InvalidError
	)
	switch {
	case errors.As(err, &held) && held.LockDelayed:
		return fmt.Sprintf("%q is in its lock-delay for another %s", held.Resource, ms(held.RemainingMs))
	case errors.As(err, &held):
		return fmt.Sprintf("%q is held by %s (token %d, %s left)", held.Resource, held.Holder, held.Token, ms(held.RemainingMs))
	case errors.As(err, &invalid) && invalid.Bounded && flagOfField[invalid.Field] != "":
		return boundMessage(invalid)
	}
	msg := err.Error()
	// The SDK's sentinels read "leased: ..."; the program name already says where the error comes from.
	return strings.ReplaceAll(msg, "leased: ", "")
}

// flagOfField names the flag that sets a request field the server may refuse as out of bounds; the
// fields are in milliseconds.
var flagOfField = map[string]string{"ttl_ms": "--ttl", "lock_delay_ms": "--lock-delay"}

// boundMessage phrases the server's bound in the flag's units: "--ttl 100ms is below the cluster's
// minimum 8s (the TTL must outlast a leader failover: ...)".
func boundMessage(e *client.InvalidError) string {
	side := "below the cluster's minimum"
	if e.Above {
		side = "above the cluster's maximum"
	}
	msg := fmt.Sprintf("%s %s is %s %s", flagOfField[e.Field], ms(e.Value), side, ms(e.Limit))
	if e.Why != "" {
		msg += " (" + e.Why + ")"
	}
	return msg
}

// reportError prints err on stderr: one line of plain words, or a JSON object with -o json.
func (a *app) reportError(err error, code int, root *cobra.Command) {
	msg := message(err)
	var usage *usageError
	if errors.As(err, &usage) {
		path := usage.cmd
		if path == "" {
			path = root.CommandPath()
		}
		if !a.jsonOut() {
			msg += fmt.Sprintf(" (see '%s --help')", path)
		}
	}
	if a.jsonOut() {
		out := map[string]any{"error": msg, "code": code}
		var (
			held   *client.HeldError
			access *client.AccessError
		)
		if errors.As(err, &held) {
			out["resource"], out["holder"], out["token"] = held.Resource, held.Holder, held.Token
			out["remaining_ms"], out["lock_delayed"] = held.RemainingMs, held.LockDelayed
		}
		if errors.As(err, &access) {
			out["identity"], out["permission"], out["resource"] = access.Identity, access.Permission, access.Resource
		}
		b, _ := json.Marshal(out)
		fmt.Fprintf(a.stderr, "%s\n", b)
		return
	}
	fmt.Fprintf(a.stderr, "leasectl: %s\n", msg)
}
