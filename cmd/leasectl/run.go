package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/leased/leased/client"
)

// commandArgs accepts `RESOURCE -- COMMAND [ARGS...]`.
func commandArgs(cmd *cobra.Command, args []string) error {
	dash := cmd.ArgsLenAtDash()
	switch {
	case dash < 0:
		return usagef(cmd, "missing '-- COMMAND [ARGS...]'")
	case dash == 0:
		return usagef(cmd, "missing RESOURCE before '--'")
	case dash > 1:
		return usagef(cmd, "expected one RESOURCE before '--', got %d arguments", dash)
	case args[0] == "":
		return usagef(cmd, "RESOURCE must not be empty")
	case len(args) < 2 || args[1] == "":
		return usagef(cmd, "missing COMMAND after '--'")
	}
	return nil
}

// forwarded are the signals run and elect pass on to their command.
var forwarded = []os.Signal{os.Interrupt, syscall.SIGTERM, syscall.SIGHUP}

func (a *app) runCommand() *cobra.Command {
	var (
		w             waitFlags
		grace         time.Duration
		holder, value string
		limit         int
	)
	cmd := &cobra.Command{
		Use:   "run RESOURCE --ttl D [--wait] [--limit N] [--grace D] -- COMMAND [ARGS...]",
		Short: "Run a command while holding a lease (a singleton cron job)",
		Long: `run takes the lease on RESOURCE, keeps it alive, and runs COMMAND with LEASE_RESOURCE, LEASE_TOKEN and
LEASE_HOLDER in its environment (stdin, stdout and stderr are passed through). When COMMAND exits the lease
is released and run exits with COMMAND's status (128+N if it was killed by signal N).

If the resource is held by someone else, run exits with code 3 without running COMMAND, unless --wait is
given (while it waits, a line on stderr says who holds the resource, at the start and at every change of
holder). SIGINT, SIGTERM and SIGHUP sent to leasectl are forwarded to COMMAND.

If the lease is lost while COMMAND runs (it expired, was released elsewhere, or could not be renewed in
time) COMMAND gets SIGTERM, then SIGKILL after --grace, and run exits with code 4 (the cluster says the lease
is gone) or 5 (no renewal succeeded in time), whatever COMMAND's own status. COMMAND should pass
LEASE_TOKEN to the storage it writes to, so that writes made after the loss are rejected.

With --limit N, RESOURCE is a counting semaphore of N slots (like 'consul lock -n N'): at most N copies of
COMMAND run at once, across every leasectl given the same RESOURCE and N. Each copy holds its own slot,
with its own LEASE_TOKEN; LEASE_LIMIT is N. When all N slots are held, run exits with code 3, or with
--wait queues (first come, first served) for a free slot. Every run on RESOURCE must give the same N:
another N while slots are held is refused (exit 2).`,
		Example: `  leasectl run jobs/nightly-report --ttl 30s -- /usr/local/bin/report --date today
  leasectl run jobs/compact --ttl 1m --wait --grace 30s -- sh -c 'compact --fence-token "$LEASE_TOKEN"'
  leasectl run jobs/transcode --ttl 30s --limit 4 --wait -- ./transcode next`,
		Args: commandArgs,
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 0 || limit > 1000 {
				return usagef(cmd, "--limit must be between 1 and 1000 slots, got %d", limit)
			}
			return w.check(cmd, durationFlag{"grace", grace}, durationFlag{"wait-timeout", w.waitTimeout})
		},
		RunE: a.body(func(cmd *cobra.Command, args []string) error {
			resource, argv := args[0], args[1:]
			opts := []client.AcquireOption{client.WithTTL(w.ttl)}
			if holder != "" {
				opts = append(opts, client.WithHolder(holder))
			}
			if value != "" {
				opts = append(opts, client.WithValue([]byte(value)))
			}
			if w.wait {
				opts = append(opts, client.WithWait())
			}
			if limit > 0 {
				opts = append(opts, client.WithLimit(limit))
			}
			return a.withClient("", func(c *client.Client) error {
				return a.holdAndRun(cmd.Context(), c, resource, argv, grace, func(ctx context.Context) (*client.Lease, error) {
					ctx, cancel := a.acquireContext(ctx, w)
					defer cancel()
					if w.wait { // the feedback runs while Acquire waits, and stops when it returns
						defer a.reportWaiting(ctx, c, resource, orDefault(holder, c.Holder()))()
					}
					return c.Acquire(ctx, resource, opts...)
				})
			})
		}),
	}
	f := cmd.Flags()
	f.DurationVar(&w.ttl, "ttl", 0, "time to live of the lease, e.g. 10s, 1m (required); it is renewed about every TTL/3")
	f.BoolVar(&w.wait, "wait", false, "wait until the resource is granted instead of exiting with code 3")
	f.DurationVar(&w.waitTimeout, "wait-timeout", 0, "with --wait, give up after this long (0: wait until interrupted)")
	f.DurationVar(&grace, "grace", 10*time.Second, "after the lease is lost, time between SIGTERM and SIGKILL")
	f.StringVar(&holder, "holder", "", "holder name recorded with the lease (default host:pid)")
	f.StringVar(&value, "value", "", "payload stored with the lease (also in LEASE_VALUE)")
	f.IntVar(&limit, "limit", 0, "treat RESOURCE as a semaphore of N slots: at most N copies run at once (1..1000; 0: one holder, a plain lease)")
	_ = cmd.MarkFlagRequired("ttl")
	return cmd
}

func (a *app) electCommand() *cobra.Command {
	var (
		ttl, grace    time.Duration
		holder, value string
	)
	cmd := &cobra.Command{
		Use:   "elect RESOURCE --value V [--ttl D] -- COMMAND [ARGS...]",
		Short: "Campaign in an election, then run a command as leader",
		Long: `elect campaigns to lead the election RESOURCE (candidates are served first come, first served) and, once
leader, runs COMMAND with LEASE_RESOURCE, LEASE_TOKEN (the leader's epoch), LEASE_HOLDER and LEASE_VALUE in
its environment. Observers see --value (for example this instance's address) with 'leasectl leader'. While
it campaigns, a line on stderr says who leads, at the start and at every change of leader.

COMMAND is handled as by 'leasectl run': signals are forwarded; on loss of leadership it gets SIGTERM, then
SIGKILL after --grace, and elect exits with code 4 or 5; otherwise elect resigns when COMMAND exits and
exits with COMMAND's status. SIGINT while still campaigning exits with code 1.`,
		Example: `  leasectl elect service/scheduler --value "$(hostname):8080" -- ./scheduler
  leasectl elect service/scheduler --value node-a --ttl 10s --grace 20s -- ./scheduler --active`,
		Args: commandArgs,
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := requireFlags(cmd, "value"); err != nil {
				return err
			}
			if err := checkTTL(cmd, "ttl", ttl); err != nil {
				return err
			}
			return notNegative(cmd, durationFlag{"grace", grace})
		},
		RunE: a.body(func(cmd *cobra.Command, args []string) error {
			resource, argv := args[0], args[1:]
			opts := []client.AcquireOption{client.WithTTL(ttl)}
			if holder != "" {
				opts = append(opts, client.WithHolder(holder))
			}
			return a.withClient("", func(c *client.Client) error {
				return a.holdAndRun(cmd.Context(), c, resource, argv, grace, func(ctx context.Context) (*client.Lease, error) {
					defer a.reportWaiting(ctx, c, resource, orDefault(holder, c.Holder()))() // while campaigning
					return c.Campaign(ctx, resource, []byte(value), opts...)
				})
			})
		}),
	}
	f := cmd.Flags()
	f.StringVar(&value, "value", "", "who this candidate is, shown to observers (required)")
	f.DurationVar(&ttl, "ttl", 10*time.Second, "time to live of the leadership lease")
	f.DurationVar(&grace, "grace", 10*time.Second, "after leadership is lost, time between SIGTERM and SIGKILL")
	f.StringVar(&holder, "holder", "", "holder name recorded with the lease (default host:pid)")
	_ = cmd.MarkFlagRequired("value")
	return cmd
}

// orDefault is s, or def when s is empty.
func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// holdAndRun takes a lease with take, runs argv while it holds, and releases it when argv exits.
// Signals received while taking the lease abandon it; signals received while argv runs are forwarded.
func (a *app) holdAndRun(ctx context.Context, c *client.Client, resource string, argv []string, grace time.Duration,
	take func(context.Context) (*client.Lease, error)) error {
	sigs, stopSigs := a.signals(forwarded...)
	defer stopSigs()

	type taken struct {
		lease *client.Lease
		err   error
	}
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	got := make(chan taken, 1)
	go func() {
		l, err := take(tctx)
		got <- taken{l, err}
	}()
	var t taken
	select {
	case t = <-got:
	case <-sigs:
		cancel()
		t = <-got
		if t.err == nil {
			a.release(ctx, t.lease)
		}
		return fmt.Errorf("%q: %w before the lease was granted", resource, errInterrupted)
	}
	if t.err != nil {
		return fmt.Errorf("acquire %q: %w", resource, t.err)
	}
	return a.supervise(ctx, t.lease, argv, grace, sigs)
}

// supervise runs argv while lease holds. On lease loss it stops argv (SIGTERM, then SIGKILL after grace)
// and returns the loss; otherwise it releases the lease and returns argv's exit status.
func (a *app) supervise(ctx context.Context, lease *client.Lease, argv []string, grace time.Duration, sigs <-chan os.Signal) error {
	child := exec.Command(argv[0], argv[1:]...)
	child.Stdin, child.Stdout, child.Stderr = a.stdin, a.stdout, a.stderr
	child.Env = append(os.Environ(),
		"LEASE_RESOURCE="+lease.Resource(),
		"LEASE_TOKEN="+strconv.FormatUint(lease.Token(), 10),
		"LEASE_HOLDER="+lease.Holder(),
		"LEASE_VALUE="+string(lease.Value()),
	)
	if lease.Limit() > 0 {
		child.Env = append(child.Env, "LEASE_LIMIT="+strconv.Itoa(lease.Limit()))
	}
	if err := child.Start(); err != nil {
		a.release(ctx, lease)
		code := 126
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			code = 127
		}
		return &exitStatus{code: code, err: fmt.Errorf("start %s: %w", argv[0], err)}
	}
	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()

	var (
		lost      error
		leaseDone = lease.Done()
		kill      <-chan time.Time
		killTimer *time.Timer
		waitErr   error
	)
loop:
	for {
		select {
		case waitErr = <-exited:
			break loop
		case s := <-sigs:
			_ = child.Process.Signal(s)
		case <-leaseDone:
			leaseDone = nil
			lost = lease.Err()
			a.warnf("lease on %q (token %d) lost: %v; sending SIGTERM to %s (SIGKILL in %v)",
				lease.Resource(), lease.Token(), message(lost), argv[0], grace)
			_ = child.Process.Signal(syscall.SIGTERM)
			killTimer = time.NewTimer(grace)
			kill = killTimer.C
		case <-kill:
			kill = nil
			a.warnf("%s still running %v after SIGTERM; sending SIGKILL", argv[0], grace)
			_ = child.Process.Kill()
		}
	}
	if killTimer != nil {
		killTimer.Stop()
	}
	status := childStatus(child.ProcessState, waitErr)
	if lost != nil {
		return fmt.Errorf("lease on %q (token %d) lost while the command ran (its status: %d): %w",
			lease.Resource(), lease.Token(), status, lost)
	}
	a.release(ctx, lease)
	return &exitStatus{code: status}
}

// release gives the lease back, best effort: if that fails it expires after its TTL.
func (a *app) release(ctx context.Context, lease *client.Lease) {
	ctx, cancel := a.requestContext(context.WithoutCancel(ctx))
	defer cancel()
	if err := lease.Release(ctx); err != nil && !errors.Is(err, client.ErrNotFound) {
		a.warnf("release %q (token %d): %s; it expires after its TTL", lease.Resource(), lease.Token(), message(err))
	}
}

// childStatus is a shell-style exit status: the exit code, or 128+N for death by signal N.
func childStatus(ps *os.ProcessState, waitErr error) int {
	if ps == nil {
		if waitErr != nil {
			return exitError
		}
		return exitOK
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}
