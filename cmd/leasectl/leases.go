package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/leased/leased/client"
)

// resourceArg accepts exactly one non-empty RESOURCE argument.
func resourceArg(cmd *cobra.Command, args []string) error {
	switch {
	case len(args) == 0:
		return usagef(cmd, "missing RESOURCE")
	case len(args) > 1:
		return usagef(cmd, "expected one RESOURCE, got %d arguments", len(args))
	case args[0] == "":
		return usagef(cmd, "RESOURCE must not be empty")
	}
	return nil
}

// checkTTL validates a --ttl style flag before the network is touched: it is positive and at least the
// millisecond the server counts in. The cluster's own bounds (its minimum is 8s by default) come back in
// its answer, which message phrases in the flag's units.
func checkTTL(cmd *cobra.Command, name string, d time.Duration) error {
	switch {
	case d <= 0:
		return usagef(cmd, "--%s %v must be positive, e.g. 10s", name, d)
	case d < time.Millisecond:
		return usagef(cmd, "--%s %v is below 1ms, the unit the cluster counts in", name, d)
	}
	return nil
}

// durationFlag is a duration flag's name (without dashes) and value.
type durationFlag struct {
	name  string
	value time.Duration
}

// notNegative reports a usage error naming all of flags, in order, if any of them is negative.
func notNegative(cmd *cobra.Command, flags ...durationFlag) error {
	names := make([]string, 0, len(flags))
	negative := false
	for _, f := range flags {
		names = append(names, "--"+f.name)
		negative = negative || f.value < 0
	}
	if negative {
		return usagef(cmd, "%s must not be negative", strings.Join(names, " and "))
	}
	return nil
}

// waitFlags are the flags of the commands that take a lease and may wait for it (acquire and run): the
// lease's --ttl, --wait, and --wait-timeout (0: wait until interrupted).
type waitFlags struct {
	ttl, waitTimeout time.Duration
	wait             bool
}

// check validates the flags before the network is touched: --ttl is given and at least 1ms, none of
// nonNegative (the command's durations, --wait-timeout among them) is negative, and --wait-timeout comes
// only with --wait.
func (w *waitFlags) check(cmd *cobra.Command, nonNegative ...durationFlag) error {
	if err := requireFlags(cmd, "ttl"); err != nil {
		return err
	}
	if err := checkTTL(cmd, "ttl", w.ttl); err != nil {
		return err
	}
	if err := notNegative(cmd, nonNegative...); err != nil {
		return err
	}
	if w.waitTimeout > 0 && !w.wait {
		return usagef(cmd, "--wait-timeout needs --wait")
	}
	return nil
}

// acquireContext bounds an Acquire made with w: by --timeout without --wait, by --wait-timeout when given,
// otherwise only by ctx.
func (a *app) acquireContext(ctx context.Context, w waitFlags) (context.Context, context.CancelFunc) {
	switch {
	case !w.wait:
		return a.requestContext(ctx)
	case w.waitTimeout > 0:
		return context.WithTimeout(ctx, w.waitTimeout)
	default:
		return context.WithCancel(ctx)
	}
}

// leaseJSON is the shape of acquire's JSON output.
type leaseJSON struct {
	Resource string `json:"resource"`
	Holder   string `json:"holder"`
	Token    uint64 `json:"token"`
	TTLMs    int64  `json:"ttl_ms"`
	Value    string `json:"value"`
}

// infoJSON is the shape of get's and list's JSON output.
type infoJSON struct {
	Resource    string `json:"resource"`
	Holder      string `json:"holder"`
	Token       uint64 `json:"token"`
	RemainingMs int64  `json:"remaining_ms"`
	TTLMs       int64  `json:"ttl_ms"`
	Value       string `json:"value"`
	// Identity is the authenticated identity holding the lease (absent without client certificates).
	Identity string `json:"identity,omitempty"`
}

func infoOf(i client.Info) infoJSON {
	return infoJSON{Resource: i.Resource, Holder: i.Holder, Token: i.Token, RemainingMs: i.Remaining.Milliseconds(),
		TTLMs: i.TTL.Milliseconds(), Value: string(i.Value), Identity: i.Identity}
}

func (a *app) acquireCommand() *cobra.Command {
	var (
		w                        waitFlags
		lockDelay                time.Duration
		holder, value, requestID string
	)
	cmd := &cobra.Command{
		Use:   "acquire RESOURCE --ttl D",
		Short: "Take a lease and print its fencing token",
		Long: `acquire takes a lease on RESOURCE and prints its holder and fencing token. leasectl does not keep the
lease alive after it exits: the lease is held for its TTL unless renewed with 'leasectl renew' (or released
with 'leasectl release'). To hold a lease for as long as a command runs, use 'leasectl run'.

If the resource is held by someone else acquire fails with exit code 3, unless --wait is given: then it
waits (first come, first served) until the resource is granted, --wait-timeout passes, or it is
interrupted; while it waits it prints a line on stderr when it starts waiting and whenever the holder
changes. --request-id makes a retried acquire return the same grant instead of "held"; the server
matches it per holder, so keep --holder the same too (the default holder is host:pid, or the host name
alone with --request-id, so that a retry from another process matches). Exit code 7 means the outcome is
unknown: a grant may exist; acquire again with the same --request-id and --holder to get it (or it
expires after its TTL).`,
		Example: `  leasectl acquire jobs/report --ttl 30s
  TOKEN=$(leasectl acquire jobs/report --ttl 1m -o json | jq .token)
  leasectl acquire db/primary --ttl 10s --holder "$(hostname)" --value 10.0.0.5:5432 --wait --wait-timeout 1m`,
		Args: resourceArg,
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			return w.check(cmd, durationFlag{"wait-timeout", w.waitTimeout}, durationFlag{"lock-delay", lockDelay})
		},
		RunE: a.body(func(cmd *cobra.Command, args []string) error {
			resource := args[0]
			if holder == "" {
				holder = defaultHolder(requestID != "")
			}
			opts := []client.AcquireOption{client.WithTTL(w.ttl), client.WithHolder(holder), client.WithLockDelay(lockDelay)}
			if value != "" {
				opts = append(opts, client.WithValue([]byte(value)))
			}
			if requestID != "" {
				opts = append(opts, client.WithRequestID(requestID))
			}
			ctx, interrupted, stop := a.interruptible(cmd.Context())
			defer stop()
			ctx, cancel := a.acquireContext(ctx, w)
			defer cancel()
			if w.wait {
				opts = append(opts, client.WithWait())
			}
			return a.withClient(holder, func(c *client.Client) error {
				stopFeedback := func() {}
				if w.wait {
					stopFeedback = a.reportWaiting(ctx, c, resource, holder)
				}
				// The lease is deliberately not released: Close stops the local keepalive and the lease
				// lives on the cluster until its TTL runs out.
				lease, err := c.Acquire(ctx, resource, opts...)
				stopFeedback()
				if err != nil {
					if interrupted() {
						return fmt.Errorf("acquire %q: %w", resource, errInterrupted)
					}
					// A --wait-timeout that ran out while queued is the SDK's ErrHeld (exit 3), naming the
					// holder the cluster last reported; a timeout (exit 5) means the cluster never answered.
					return fmt.Errorf("acquire %q: %w", resource, err)
				}
				out := leaseJSON{Resource: lease.Resource(), Holder: lease.Holder(), Token: lease.Token(),
					TTLMs: lease.TTL().Milliseconds(), Value: string(lease.Value())}
				if a.jsonOut() {
					return a.emitJSON(out)
				}
				t := a.newTable("RESOURCE", "HOLDER", "TOKEN", "TTL", "VALUE")
				t.row(out.Resource, out.Holder, strconv.FormatUint(out.Token, 10), dur(lease.TTL()), orDash(out.Value))
				return t.flush()
			})
		}),
	}
	f := cmd.Flags()
	f.DurationVar(&w.ttl, "ttl", 0, "time to live of the lease, e.g. 10s, 1m (required)")
	f.StringVar(&holder, "holder", "", "holder name recorded with the lease (default host:pid; with --request-id, host)")
	f.StringVar(&value, "value", "", "payload stored with the lease (e.g. an address)")
	f.BoolVar(&w.wait, "wait", false, "wait until the resource is granted instead of failing when it is held")
	f.DurationVar(&w.waitTimeout, "wait-timeout", 0, "with --wait, give up after this long (0: wait until interrupted)")
	f.StringVar(&requestID, "request-id", "", "idempotency key: a retry with the same key (and holder) returns the same grant")
	f.DurationVar(&lockDelay, "lock-delay", 0, "keep the resource ungrantable this long after the lease expires (not after release)")
	_ = cmd.MarkFlagRequired("ttl")
	return cmd
}

func (a *app) renewCommand() *cobra.Command {
	var token uint64
	cmd := &cobra.Command{
		Use:   "renew RESOURCE --token T",
		Short: "Renew a lease once, for another TTL",
		Long: `renew renews the lease on RESOURCE whose fencing token is T, once: the lease lives for another full TTL.
It fails with exit code 4 when T is no longer the resource's current grant (released, expired or re-granted),
and exit code 7 when no answer said whether the renewal happened.`,
		Example: `  leasectl renew jobs/report --token 1234
  while leasectl renew jobs/report --token "$TOKEN" >/dev/null; do sleep 10; done`,
		Args:    resourceArg,
		PreRunE: tokenRequired(&token),
		RunE: a.body(func(cmd *cobra.Command, args []string) error {
			ctx, cancel := a.requestContext(cmd.Context())
			defer cancel()
			return a.withClient("", func(c *client.Client) error {
				ttl, err := c.Renew(ctx, args[0], token)
				if err != nil {
					return fmt.Errorf("renew %q token %d: %w", args[0], token, err)
				}
				if a.jsonOut() {
					return a.emitJSON(map[string]any{"resource": args[0], "token": token, "ttl_ms": ttl.Milliseconds()})
				}
				t := a.newTable("RESOURCE", "TOKEN", "TTL")
				t.row(args[0], strconv.FormatUint(token, 10), dur(ttl))
				return t.flush()
			})
		}),
	}
	cmd.Flags().Uint64Var(&token, "token", 0, "fencing token of the lease (required)")
	_ = cmd.MarkFlagRequired("token")
	return cmd
}

func (a *app) releaseCommand() *cobra.Command {
	var token uint64
	cmd := &cobra.Command{
		Use:   "release RESOURCE --token T",
		Short: "Release a lease so others can take it at once",
		Long: `release ends the lease on RESOURCE whose fencing token is T. Releasing again is safe: a release that
already took effect (say, an earlier attempt whose answer was lost) succeeds. It fails with exit code 4
when T's lease did not end by a release (it expired, or T was never its grant), and exit code 7 when the
outcome is unknown (the cluster got the request but no answer said whether it took effect: run it again).`,
		Example: `  leasectl release jobs/report --token 1234`,
		Args:    resourceArg,
		PreRunE: tokenRequired(&token),
		RunE: a.body(func(cmd *cobra.Command, args []string) error {
			ctx, cancel := a.requestContext(cmd.Context())
			defer cancel()
			return a.withClient("", func(c *client.Client) error {
				if err := c.Release(ctx, args[0], token); err != nil {
					return fmt.Errorf("release %q token %d: %w", args[0], token, err)
				}
				if a.jsonOut() {
					return a.emitJSON(map[string]any{"resource": args[0], "token": token, "released": true})
				}
				t := a.newTable("RESOURCE", "TOKEN", "RELEASED")
				t.row(args[0], strconv.FormatUint(token, 10), "yes")
				return t.flush()
			})
		}),
	}
	cmd.Flags().Uint64Var(&token, "token", 0, "fencing token of the lease (required)")
	_ = cmd.MarkFlagRequired("token")
	return cmd
}

func tokenRequired(token *uint64) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, _ []string) error {
		if err := requireFlags(cmd, "token"); err != nil {
			return err
		}
		if *token == 0 {
			return usagef(cmd, "--token must be a fencing token (> 0)")
		}
		return nil
	}
}

func (a *app) getCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "get RESOURCE",
		Short: "Show who holds a resource",
		Long: `get shows the current lease on RESOURCE: holder, fencing token, TTL, remaining time and value. It exits
with code 4 when nobody holds the resource. The read is linearizable.`,
		Example: `  leasectl get jobs/report
  leasectl get jobs/report -o json | jq -r .holder`,
		Args: resourceArg,
		RunE: a.body(func(cmd *cobra.Command, args []string) error {
			ctx, cancel := a.requestContext(cmd.Context())
			defer cancel()
			return a.withReadClient(ctx, func(c *client.Client) error {
				info, err := c.Get(ctx, args[0])
				if errors.Is(err, client.ErrNotFound) {
					return fmt.Errorf("nobody holds %q: %w", args[0], client.ErrNotFound)
				}
				if err != nil {
					return fmt.Errorf("get %q: %w", args[0], err)
				}
				return a.printInfos([]client.Info{info})
			})
		}),
	}
	return cmd
}

func (a *app) printInfos(infos []client.Info) error {
	if a.jsonOut() {
		for _, i := range infos {
			if err := a.emitJSON(infoOf(i)); err != nil {
				return err
			}
		}
		return nil
	}
	t := a.newTable("RESOURCE", "HOLDER", "TOKEN", "TTL", "REMAINING", "VALUE")
	for _, i := range infos {
		t.row(i.Resource, i.Holder, strconv.FormatUint(i.Token, 10), dur(i.TTL), dur(i.Remaining), orDash(string(i.Value)))
	}
	return t.flush()
}

// listPageSize is the page size list asks for (the server's default and a safe maximum).
const listPageSize = 100

func (a *app) listCommand() *cobra.Command {
	var (
		prefix, holder string
		limit          int
	)
	cmd := &cobra.Command{
		Use:   "list [--prefix P] [--limit N]",
		Short: "List current leases",
		Long: `list prints every current lease (in resource order), or those whose resource starts with --prefix,
or those of --holder. It pages through all of them unless --limit caps the count.`,
		Example: `  leasectl list
  leasectl list --prefix jobs/ --limit 10
  leasectl list -o json | jq -r .resource`,
		Args: noArgs,
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 0 {
				return usagef(cmd, "--limit must not be negative")
			}
			return nil
		},
		RunE: a.body(func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := a.requestContext(cmd.Context())
			defer cancel()
			return a.withReadClient(ctx, func(c *client.Client) error {
				var all []client.Info
				opts := client.ListOptions{Prefix: prefix, Holder: holder}
				for {
					opts.Limit = listPageSize
					if limit > 0 {
						opts.Limit = min(listPageSize, limit-len(all))
					}
					page, next, err := c.List(ctx, opts)
					if err != nil {
						return fmt.Errorf("list: %w", err)
					}
					all = append(all, page...)
					if next == "" || (limit > 0 && len(all) >= limit) {
						break
					}
					opts.PageToken = next
				}
				return a.printInfos(all)
			})
		}),
	}
	cmd.Flags().StringVar(&prefix, "prefix", "", "only resources starting with this prefix")
	cmd.Flags().StringVar(&holder, "holder", "", "only leases of this holder")
	cmd.Flags().IntVar(&limit, "limit", 0, "print at most this many leases (0: all)")
	return cmd
}

// noArgs rejects positional arguments.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef(cmd, "unexpected argument %q", args[0])
	}
	return nil
}
