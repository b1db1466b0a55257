package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/leased/leased/client"
	"github.com/leased/leased/client/loadgen"
)

// benchWorkloads are bench's workloads, in the order its help lists them.
var benchWorkloads = []string{"acquire", "contended", "renew", "read", "keepalive", "failover"}

// benchOwnFlags are the flags only some workloads take, and which.
var benchOwnFlags = map[string][]string{
	"clients":      {"acquire", "contended", "renew", "read"},
	"serializable": {"read"},
	"leases":       {"keepalive"},
	"batch":        {"keepalive"},
	"streams":      {"keepalive"},
	"gap":          {"failover"},
}

// keepAliveTTL is keepalive's --ttl when none is given: its leases must outlast taking them all (half the
// TTL at most) and a round of renewals.
const keepAliveTTL = time.Minute

// releaseBound bounds releasing keepalive's leases at the end; a shorter --ttl bounds it instead, since by
// then every lease not released has expired anyway.
const releaseBound = time.Minute

// benchFlags are bench's own flags.
type benchFlags struct {
	clients   int
	duration  time.Duration
	resources string
	ttl       time.Duration
	maxOps    int
	// read
	serializable bool
	// keepalive
	leases, batch, streams int
	// failover
	gap time.Duration
}

// benchJSON is one line of bench's JSON output. Latencies are in milliseconds, with fractions.
type benchJSON struct {
	Workload     string  `json:"workload"`
	Clients      int     `json:"clients"`
	Serializable bool    `json:"serializable,omitempty"` // read only
	DurationMs   int64   `json:"duration_ms"`
	Ops          int     `json:"ops"`
	Errors       int     `json:"errors"`
	Rate         float64 `json:"rate"`
	P50Ms        float64 `json:"p50_ms"`
	P90Ms        float64 `json:"p90_ms"`
	P99Ms        float64 `json:"p99_ms"`
	MaxMs        float64 `json:"max_ms"`
	FirstError   string  `json:"first_error,omitempty"`
}

// keepAliveJSON is keepalive's JSON output: ops are KeepAlive requests (batches), rate is renewed leases
// per second.
type keepAliveJSON struct {
	Workload    string  `json:"workload"`
	Streams     int     `json:"streams"`
	Leases      int     `json:"leases"`
	Batch       int     `json:"batch"`
	DurationMs  int64   `json:"duration_ms"`
	Ops         int     `json:"ops"`
	Errors      int     `json:"errors"`
	Renewals    int64   `json:"renewals"`
	Rate        float64 `json:"rate"`
	BatchesPerS float64 `json:"batches_per_s"`
	P50Ms       float64 `json:"p50_ms"`
	P90Ms       float64 `json:"p90_ms"`
	P99Ms       float64 `json:"p99_ms"`
	MaxMs       float64 `json:"max_ms"`
	Released    int     `json:"released"`
	FirstError  string  `json:"first_error,omitempty"`
}

// failoverJSON is failover's JSON output: ops are acquires.
type failoverJSON struct {
	Workload       string       `json:"workload"`
	GapMs          float64      `json:"gap_ms"`
	DurationMs     int64        `json:"duration_ms"`
	Ops            int          `json:"ops"`
	Errors         int          `json:"errors"`
	ReleaseErrors  int          `json:"release_errors"`
	Outages        []outageJSON `json:"outages"`
	OutageMedianMs float64      `json:"outage_median_ms"`
	OutageMaxMs    float64      `json:"outage_max_ms"`
	FirstError     string       `json:"first_error,omitempty"`
}

// outageJSON is one outage: from the last acquire before it (start_ms after bench began, started_at on
// the wall clock) for length_ms, to the next acquire (or to the end, ended false).
type outageJSON struct {
	StartMs    float64 `json:"start_ms"`
	StartedAt  string  `json:"started_at"`
	LengthMs   float64 `json:"length_ms"`
	Ended      bool    `json:"ended"`
	Errors     int     `json:"errors"`
	FirstError string  `json:"first_error,omitempty"`
}

func (a *app) benchCommand() *cobra.Command {
	var f benchFlags
	cmd := &cobra.Command{
		Use:   "bench acquire|contended|renew|read|keepalive|failover",
		Short: "Measure the cluster's rate and latency for a lease workload, or its outages during a failover",
		Long: `bench drives the cluster with --clients concurrent workers (keepalive: --streams; failover: one) for
--duration and prints the rate of successful operations per second, the latency percentiles p50, p90,
p99 and the maximum (of every operation, failed ones included), and the count of errors. It sizes a
cluster: run it from a machine like your clients', against the cluster's endpoints. Workers share SDK
clients, 16 to a client.

  acquire    each operation takes a lease on a fresh resource, --resources/WORKER/SEQ, and keeps it
             (renewed over the SDK's KeepAlive stream) until bench ends; the leases then expire after --ttl
  contended  every worker queues for the one resource --resources/contended (FIFO) and releases it as soon
             as it is granted: one operation is one handoff
  renew      each worker holds one lease, --resources/renew/WORKER, and renews it with unary Renew calls
  read       bench holds the one resource --resources/read and every worker reads it with Get, checking
             that the answer names that lease: linearizable (the leader answers after a ReadIndex round,
             as ValidateToken does), or with --serializable from the leader's own state (one round trip
             and no consensus: the floor under every other workload's latency)
  keepalive  batched renewals, as a client holding many leases sends them: bench takes --leases leases
             (--resources/keepalive/N, --ttl default 1m) on the leader, then renews them --batch at a time
             per KeepAlive request over --streams streams to the leader, one request in flight on each.
             An operation is one batch; the rate counts the leases the cluster answered as renewed. At the
             end bench releases the leases (for at most a minute, or --ttl if shorter); any it could not
             release expire after --ttl. Taking them must finish within half of --ttl.
  failover   outages as a client sees them: one worker acquires a lease on a fresh resource
             (--resources/failover/0/SEQ) and releases it, over and over, and every gap longer than --gap
             between two successful acquires is an outage (healthy, a gap is a release and an acquire:
             pick --gap well above that). bench cannot stop the leader itself: while it runs, stop, kill
             or partition the leader (or a node) yourself. Each outage is reported with its start and
             length, and told on stderr as it starts and ends. It takes no --clients.

Each run stops after --duration or --max-ops operations, whichever comes first; Ctrl-C stops it early and
prints what was measured. bench exits 1 when errors happened (the first is printed on stderr) and with the
error's own code when no operation succeeded; failover exits 0 despite the errors of its outages, and 1
when the run ended during one. The leases it takes count against the cluster's limits (--max-leases: a
long acquire run at a high rate can reach it); use a prefix no one else uses.`,
		Example: `  leasectl bench acquire --clients 64 --duration 10s
  leasectl bench contended --clients 16 -o json
  leasectl --endpoints 10.0.0.1:7101,10.0.0.2:7101 bench renew --clients 1
  leasectl bench read --serializable
  leasectl bench keepalive --leases 100000 --batch 1000 --streams 4
  leasectl bench failover --duration 60s --gap 100ms   # and stop the leader meanwhile`,
		Args:      benchArgs,
		ValidArgs: benchWorkloads,
		PreRunE: func(cmd *cobra.Command, args []string) error {
			return f.resolve(cmd, args[0])
		},
		RunE: a.body(func(cmd *cobra.Command, args []string) error {
			ctx, interrupted, stop := a.interruptible(cmd.Context())
			defer stop()
			switch args[0] {
			case "keepalive":
				return a.benchKeepAlive(ctx, f, interrupted)
			case "failover":
				return a.benchFailover(ctx, f, interrupted)
			}
			r, err := a.bench(ctx, args[0], f)
			if err != nil {
				return err
			}
			if err := a.printBench(args[0], f, r); err != nil {
				return err
			}
			return benchOutcome(r, interrupted())
		}),
	}
	fl := cmd.Flags()
	fl.IntVar(&f.clients, "clients", 1, "concurrent workers, each with one operation in flight (at most 10,000; acquire, contended, renew, read)")
	fl.DurationVar(&f.duration, "duration", 10*time.Second, "how long to run")
	fl.StringVar(&f.resources, "resources", "", "prefix of the resources bench uses (default bench/ and a random suffix)")
	fl.DurationVar(&f.ttl, "ttl", 10*time.Second, "TTL of the leases bench takes (keepalive's default: 1m)")
	fl.IntVar(&f.maxOps, "max-ops", loadgen.DefaultMaxOps, "most operations in all")
	fl.BoolVar(&f.serializable, "serializable", false, "read: serializable reads of the answering node's state instead of linearizable ones")
	fl.IntVar(&f.leases, "leases", 20_000, "keepalive: leases to hold and renew (at most 1,000,000)")
	fl.IntVar(&f.batch, "batch", 1000, "keepalive: leases per KeepAlive request (at most 10,000, the servers' default --max-keepalive-leases)")
	fl.IntVar(&f.streams, "streams", 4, "keepalive: KeepAlive streams to the leader, each with one request in flight")
	fl.DurationVar(&f.gap, "gap", 100*time.Millisecond, "failover: the longest gap between two successful acquires that is not an outage")
	return cmd
}

// resolve checks the flags of workload and fills in their defaults: every check runs before anything is
// sent.
func (f *benchFlags) resolve(cmd *cobra.Command, workload string) error {
	for _, name := range slices.Sorted(maps.Keys(benchOwnFlags)) {
		if cmd.Flags().Changed(name) && !slices.Contains(benchOwnFlags[name], workload) {
			hint := ""
			if name == "clients" && workload == "keepalive" {
				hint = " (it takes --streams)"
			}
			return usagef(cmd, "--%s does not apply to bench %s%s", name, workload, hint)
		}
	}
	o := loadgen.Options{Clients: f.clients, Duration: f.duration, MaxOps: f.maxOps}
	switch workload {
	case "keepalive":
		o.Clients = f.streams
		if err := (loadgen.KeepAliveOptions{Leases: f.leases, Batch: f.batch, Streams: f.streams}).Validate(); err != nil {
			return usagef(cmd, "%v", err)
		}
		if !cmd.Flags().Changed("ttl") {
			f.ttl = keepAliveTTL
		}
	case "failover":
		o.Clients = 1
		if err := (loadgen.Failover{Gap: f.gap}).Validate(); err != nil {
			return usagef(cmd, "%v", err)
		}
	}
	if err := o.Validate(); err != nil {
		return usagef(cmd, "%v", err)
	}
	switch {
	case f.ttl <= 0:
		return usagef(cmd, "--ttl must be positive, not %v", f.ttl)
	case cmd.Flags().Changed("resources") && f.resources == "":
		return usagef(cmd, "--resources must not be empty")
	case f.resources == "":
		f.resources = "bench/" + randomSuffix()
	}
	return nil
}

// benchArgs accepts exactly one known workload.
func benchArgs(cmd *cobra.Command, args []string) error {
	if len(args) != 1 {
		return usagef(cmd, "want one workload (%s), got %d arguments", workloadList(), len(args))
	}
	if slices.Contains(benchWorkloads, args[0]) {
		return nil
	}
	return usagef(cmd, "unknown workload %q: want %s", args[0], workloadList())
}

// workloadList is "acquire, contended, renew, read, keepalive or failover".
func workloadList() string {
	n := len(benchWorkloads)
	return strings.Join(benchWorkloads[:n-1], ", ") + " or " + benchWorkloads[n-1]
}

// bench runs workload and returns what it measured.
func (a *app) bench(ctx context.Context, workload string, f benchFlags) (loadgen.Result, error) {
	pool, err := loadgen.NewPool(client.Config{
		Endpoints: a.endpoints, TLS: a.tlsConfig, DialTimeout: a.timeout, RequestTimeout: a.timeout,
	}, f.clients)
	if err != nil {
		return loadgen.Result{}, err
	}
	defer pool.Close()
	var op loadgen.Op
	switch workload {
	case "acquire":
		op = pool.Acquire(f.resources, f.ttl)
	case "contended":
		op = pool.Contended(f.resources+"/contended", f.ttl)
	case "renew":
		// Each setup acquire is bounded by the SDK's RequestTimeout, --timeout.
		if op, err = pool.Renew(ctx, f.resources+"/renew", f.clients, f.ttl); err != nil {
			return loadgen.Result{}, err
		}
	case "read":
		if op, err = pool.Read(ctx, f.resources+"/read", f.ttl, f.serializable); err != nil {
			return loadgen.Result{}, err
		}
	}
	// Each operation is bounded by --timeout, as every other request of leasectl is.
	return loadgen.Run(ctx, loadgen.Options{Clients: f.clients, Duration: f.duration, MaxOps: f.maxOps, OpTimeout: a.timeout}, op)
}

// benchOutcome is bench's error after printing: errInterrupted after Ctrl-C (which fails the operations in
// flight), the first error's own when nothing succeeded, exit 1 when some operations failed.
func benchOutcome(r loadgen.Result, interrupted bool) error {
	switch {
	case interrupted:
		return errInterrupted
	case r.Errors > 0 && r.Errors == r.Ops:
		return fmt.Errorf("all %d operations failed, the first with: %w", r.Ops, r.FirstErr)
	case r.Errors > 0:
		return fmt.Errorf("%d of %d operations failed, the first with: %s", r.Errors, r.Ops, message(r.FirstErr))
	}
	return nil
}

func (a *app) printBench(workload string, f benchFlags, r loadgen.Result) error {
	msf := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	if a.jsonOut() {
		j := benchJSON{
			Workload: workload, Clients: f.clients, Serializable: f.serializable, DurationMs: r.Elapsed.Milliseconds(), Ops: r.Ops, Errors: r.Errors,
			Rate: math.Round(r.Rate()*100) / 100, P50Ms: msf(r.P50), P90Ms: msf(r.P90), P99Ms: msf(r.P99), MaxMs: msf(r.Max),
		}
		if r.FirstErr != nil {
			j.FirstError = message(r.FirstErr)
		}
		return a.emitJSON(j)
	}
	lat := func(d time.Duration) string { return strconv.FormatFloat(msf(d), 'f', 2, 64) + "ms" }
	t := a.newTable("WORKLOAD", "CLIENTS", "DURATION", "OPS", "ERRORS", "RATE/S", "P50", "P90", "P99", "MAX")
	t.row(workload, strconv.Itoa(f.clients), dur(r.Elapsed), strconv.Itoa(r.Ops), strconv.Itoa(r.Errors),
		strconv.FormatFloat(r.Rate(), 'f', 0, 64), lat(r.P50), lat(r.P90), lat(r.P99), lat(r.Max))
	return t.flush()
}

// randomSuffix names a bench run's resources so that two runs do not collide.
func randomSuffix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
