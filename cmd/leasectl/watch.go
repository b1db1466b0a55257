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

// eventJSON is the shape of watch's JSON output.
type eventJSON struct {
	// Time is when leasectl received the event (RFC 3339, milliseconds; events carry no time of their own).
	Time     string `json:"time"`
	Type     string `json:"type"`
	Resource string `json:"resource"`
	Holder   string `json:"holder"`
	Token    uint64 `json:"token"`
	Index    uint64 `json:"index"`
	Value    string `json:"value"`
}

func (a *app) watchCommand() *cobra.Command {
	var (
		prefix string
		from   uint64
	)
	cmd := &cobra.Command{
		Use:   "watch [RESOURCE | --prefix P] [--from-index N]",
		Short: "Stream lease events until interrupted",
		Long: `watch prints every grant, release and expiry of RESOURCE, of the resources starting with --prefix, or of
all resources, in log order, until interrupted (SIGINT or SIGTERM: exit code 0). Without --from-index it
starts with the next event; with it, at that log index (exit 1 if the cluster no longer keeps that much
history). With -o json each event is one line: {"time","type","resource","holder","token","index","value"}.
Table output prints one line per event as it arrives. The time is when leasectl received the event, in
RFC 3339 with milliseconds (events carry no time of their own).`,
		Example: `  leasectl watch jobs/report
  leasectl watch --prefix jobs/ -o json
  leasectl watch --from-index 1200 -o json | jq -c 'select(.type == "expired")'`,
		Args: func(cmd *cobra.Command, args []string) error {
			switch {
			case len(args) > 1:
				return usagef(cmd, "expected at most one RESOURCE, got %d arguments", len(args))
			case len(args) == 1 && args[0] == "":
				return usagef(cmd, "RESOURCE must not be empty")
			case len(args) == 1 && prefix != "":
				return usagef(cmd, "give either RESOURCE or --prefix, not both")
			}
			return nil
		},
		RunE: a.body(func(cmd *cobra.Command, args []string) error {
			wo := client.WatchOptions{Prefix: prefix, FromIndex: from}
			if len(args) == 1 {
				wo.Resource = args[0]
			}
			ctx, interrupted, stop := a.interruptible(cmd.Context())
			defer stop()
			return a.withClient("", func(c *client.Client) error {
				// The SDK's Watch retries an unreachable cluster until it is interrupted. A first read
				// bounded by --timeout turns "nothing answers" into exit 5; once a leader has answered,
				// watch rides out later outages and resumes without losing events.
				rctx, cancel := a.requestContext(ctx)
				_, _, err := c.List(rctx, client.ListOptions{Prefix: wo.Resource + wo.Prefix, Limit: 1})
				cancel()
				if err != nil {
					if interrupted() {
						return nil
					}
					return fmt.Errorf("watch: %w", err)
				}
				first := true
				err = c.Watch(ctx, wo, func(e client.Event) error {
					at := a.timestamp()
					if a.jsonOut() {
						return a.emitJSON(eventJSON{Time: at, Type: e.Type.String(), Resource: e.Lease.Resource, Holder: e.Lease.Holder,
							Token: e.Lease.Token, Index: e.Index, Value: string(e.Lease.Value)})
					}
					// One aligned line per event; each is flushed at once, so widths are fixed up front.
					a.outMu.Lock()
					defer a.outMu.Unlock()
					if first {
						first = false
						fmt.Fprintf(a.stdout, "%-29s %-8s %-10s %-30s %-24s %-10s %s\n", "TIME", "INDEX", "TYPE", "RESOURCE", "HOLDER", "TOKEN", "VALUE")
					}
					_, err := fmt.Fprintf(a.stdout, "%-29s %-8d %-10s %-30s %-24s %-10d %s\n", at, e.Index, e.Type, e.Lease.Resource,
						orDash(e.Lease.Holder), e.Lease.Token, cell(string(e.Lease.Value)))
					return err
				})
				if interrupted() {
					return nil
				}
				return watchError(err)
			})
		}),
	}
	cmd.Flags().StringVar(&prefix, "prefix", "", "watch every resource starting with this prefix")
	cmd.Flags().Uint64Var(&from, "from-index", 0, "start with events at or after this log index (0: from now)")
	return cmd
}

func watchError(err error) error {
	var compacted *client.CompactedError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &compacted):
		return fmt.Errorf("watch: events before index %d are no longer kept; start at --from-index %d or later",
			compacted.OldestIndex, compacted.OldestIndex)
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("watch: %w", errInterrupted)
	}
	return fmt.Errorf("watch: %w", err)
}

// leaderJSON is the shape of leader's JSON output; holder is "" while nobody leads.
type leaderJSON struct {
	// Time (leader --watch only) is when leasectl learned of the leader, like watch's.
	Time     string `json:"time,omitempty"`
	Resource string `json:"resource"`
	Holder   string `json:"holder"`
	Token    uint64 `json:"token"`
	Value    string `json:"value"`
}

func (a *app) leaderCommand() *cobra.Command {
	var watch bool
	cmd := &cobra.Command{
		Use:   "leader RESOURCE [--watch]",
		Short: "Show the leader of an election",
		Long: `leader prints who leads the election RESOURCE (see 'leasectl elect'): holder, value and fencing token (the
leader's epoch). It exits with code 4 when nobody leads. With --watch it prints the current leader and then
one line at every change ("-" / holder "" while nobody leads) until interrupted (exit 0), each with the
time leasectl learned of it (RFC 3339 with milliseconds).`,
		Example: `  leasectl leader service/scheduler
  leasectl leader service/scheduler --watch -o json`,
		Args: resourceArg,
		RunE: a.body(func(cmd *cobra.Command, args []string) error {
			resource := args[0]
			if !watch {
				ctx, cancel := a.requestContext(cmd.Context())
				defer cancel()
				return a.withReadClient(ctx, func(c *client.Client) error {
					li, err := c.Leader(ctx, resource)
					if errors.Is(err, client.ErrNotFound) {
						return fmt.Errorf("nobody leads %q: %w", resource, client.ErrNotFound)
					}
					if err != nil {
						return fmt.Errorf("leader %q: %w", resource, err)
					}
					if a.jsonOut() {
						return a.emitJSON(leaderJSON{Resource: resource, Holder: li.Holder, Token: li.Token, Value: string(li.Value)})
					}
					t := a.newTable("RESOURCE", "HOLDER", "TOKEN", "VALUE")
					t.row(resource, li.Holder, strconv.FormatUint(li.Token, 10), orDash(string(li.Value)))
					return t.flush()
				})
			}
			ctx, interrupted, stop := a.interruptible(cmd.Context())
			defer stop()
			return a.withClient("", func(c *client.Client) error {
				first := true
				err := c.Observe(ctx, resource, func(li client.LeaderInfo) error {
					err := a.printLeaderChange(resource, li, first)
					first = false
					return err
				})
				if interrupted() {
					return nil
				}
				return watchError(err)
			})
		}),
	}
	cmd.Flags().BoolVar(&watch, "watch", false, "keep printing the leader at every change")
	return cmd
}

// printLeaderChange prints one line of leader --watch, with the time it was learned.
func (a *app) printLeaderChange(resource string, li client.LeaderInfo, header bool) error {
	at := a.timestamp()
	if a.jsonOut() {
		return a.emitJSON(leaderJSON{Time: at, Resource: resource, Holder: li.Holder, Token: li.Token, Value: string(li.Value)})
	}
	a.outMu.Lock()
	defer a.outMu.Unlock()
	if header {
		fmt.Fprintf(a.stdout, "%-29s %-30s %-24s %-10s %s\n", "TIME", "RESOURCE", "HOLDER", "TOKEN", "VALUE")
	}
	token := "-"
	if li.Token != 0 {
		token = strconv.FormatUint(li.Token, 10)
	}
	_, err := fmt.Fprintf(a.stdout, "%-29s %-30s %-24s %-10s %s\n", at, resource, orDash(li.Holder), token, cell(string(li.Value)))
	return err
}

// timestampLayout is RFC 3339 with milliseconds, in the local time zone.
const timestampLayout = "2006-01-02T15:04:05.000Z07:00"

// timestamp is now, for a line of watch or leader --watch.
func (a *app) timestamp() string {
	now := time.Now
	if a.now != nil {
		now = a.now
	}
	return now().Format(timestampLayout)
}

// cell is a value for a streamed table line: "-" when empty, on one line.
func cell(s string) string {
	return orDash(strings.NewReplacer("\t", " ", "\n", " ").Replace(s))
}
