package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/client/loadgen"
)

// keepAliveRun is what bench keepalive measured.
type keepAliveRun struct {
	r        loadgen.Result // the batches
	renewals int64          // leases answered as renewed
	released int
}

// benchKeepAlive runs bench keepalive: it takes the leases on the leader, renews them in batches, always
// releases what it took, prints the measurement and returns bench's outcome.
func (a *app) benchKeepAlive(ctx context.Context, f benchFlags, interrupted func() bool) error {
	run, err := a.keepAlive(ctx, f)
	if err == nil {
		err = a.printKeepAlive(f, run)
	}
	switch {
	case interrupted(): // what was measured is printed; an interrupted setup has nothing to print
		return errInterrupted
	case err != nil:
		return err
	}
	return batchesOutcome(run.r)
}

func (a *app) keepAlive(ctx context.Context, f benchFlags) (keepAliveRun, error) {
	c, err := a.newClient(a.endpoints, "")
	if err != nil {
		return keepAliveRun{}, err
	}
	defer c.Close()
	leader, err := loadgen.Leader(ctx, c)
	if err != nil {
		return keepAliveRun{}, err
	}
	conn, err := loadgen.Dial(leader, a.tlsConfig)
	if err != nil {
		return keepAliveRun{}, err
	}
	defer conn.Close()
	api := leasepb.NewLeasesClient(conn)

	// Every lease must be held before the first one expires, with time to spare for the first round of
	// renewals: taking them may last half of --ttl.
	start := time.Now()
	take := loadgen.Options{Clients: loadgen.FillWorkers, Duration: f.ttl / 2, MaxOps: f.leases, OpTimeout: a.timeout}
	refs, err := loadgen.TakeLeases(ctx, api, take, f.resources+"/keepalive", f.ttl)
	var run keepAliveRun
	switch {
	case errors.Is(err, loadgen.ErrIncomplete):
		err = fmt.Errorf("took %d of %d leases within half of --ttl (%v), after which the first would expire "+
			"before their first renewal: raise --ttl or lower --leases", len(refs), f.leases, dur(f.ttl/2))
	case err != nil:
		err = fmt.Errorf("take %d leases: %w", f.leases, err)
	default:
		a.warnf("took %d leases in %v; renewing them %d per request over %d streams to %s for %v",
			len(refs), dur(time.Since(start)), f.batch, f.streams, leader, f.duration)
		run.r, run.renewals, err = renewBatches(ctx, api, refs, f, a.timeout)
	}
	run.released = a.releaseBench(ctx, api, refs, f.ttl)
	return run, err
}

// renewBatches renews refs in batches for the run's duration.
func renewBatches(ctx context.Context, api leasepb.LeasesClient, refs []*leasepb.LeaseRef, f benchFlags, timeout time.Duration) (loadgen.Result, int64, error) {
	ka, err := loadgen.OpenKeepAlive(ctx, api, refs, f.streams, f.batch)
	if err != nil {
		return loadgen.Result{}, 0, err
	}
	defer ka.Close()
	// Each batch is bounded by --timeout, as every other request of leasectl is.
	r, err := loadgen.Run(ctx, loadgen.Options{Clients: f.streams, Duration: f.duration, MaxOps: f.maxOps, OpTimeout: timeout}, ka.Op())
	return r, ka.Renewed(), err
}

// releaseBench releases refs, for at most releaseBound or ttl, whichever is shorter: Ctrl-C does not stop
// it. It says on stderr how it went and returns how many were released.
func (a *app) releaseBench(ctx context.Context, api leasepb.LeasesClient, refs []*leasepb.LeaseRef, ttl time.Duration) int {
	if len(refs) == 0 {
		return 0
	}
	bound := min(ttl, releaseBound)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), bound)
	defer cancel()
	start := time.Now()
	n, err := loadgen.ReleaseLeases(ctx, api, loadgen.Options{Clients: loadgen.FillWorkers, Duration: bound, OpTimeout: a.timeout}, refs)
	if err != nil {
		a.warnf("released %d of %d leases in %v (the first failure: %s); the rest expire within --ttl (%v)",
			n, len(refs), dur(time.Since(start)), message(err), ttl)
	} else {
		a.warnf("released %d leases in %v", n, dur(time.Since(start)))
	}
	return n
}

// batchesOutcome is keepalive's error after printing, as benchOutcome's for batches.
func batchesOutcome(r loadgen.Result) error {
	switch {
	case r.Errors > 0 && r.Errors == r.Ops:
		return fmt.Errorf("all %d batches failed, the first with: %w", r.Ops, r.FirstErr)
	case r.Errors > 0:
		return fmt.Errorf("%d of %d batches failed, the first with: %s", r.Errors, r.Ops, message(r.FirstErr))
	}
	return nil
}

func (a *app) printKeepAlive(f benchFlags, run keepAliveRun) error {
	r := run.r
	rate, batches := 0.0, r.Rate()
	if r.Elapsed > 0 {
		rate = float64(run.renewals) / r.Elapsed.Seconds()
	}
	msf := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	if a.jsonOut() {
		j := keepAliveJSON{
			Workload: "keepalive", Streams: f.streams, Leases: f.leases, Batch: f.batch, DurationMs: r.Elapsed.Milliseconds(),
			Ops: r.Ops, Errors: r.Errors, Renewals: run.renewals, Rate: math.Round(rate*100) / 100,
			BatchesPerS: math.Round(batches*100) / 100, P50Ms: msf(r.P50), P90Ms: msf(r.P90), P99Ms: msf(r.P99), MaxMs: msf(r.Max),
			Released: run.released,
		}
		if r.FirstErr != nil {
			j.FirstError = message(r.FirstErr)
		}
		return a.emitJSON(j)
	}
	lat := func(d time.Duration) string { return strconv.FormatFloat(msf(d), 'f', 2, 64) + "ms" }
	t := a.newTable("WORKLOAD", "STREAMS", "LEASES", "BATCH", "DURATION", "BATCHES", "ERRORS", "RENEWALS/S", "BATCHES/S",
		"P50", "P90", "P99", "MAX")
	t.row("keepalive", strconv.Itoa(f.streams), strconv.Itoa(f.leases), strconv.Itoa(f.batch), dur(r.Elapsed),
		strconv.Itoa(r.Ops), strconv.Itoa(r.Errors), strconv.FormatFloat(rate, 'f', 0, 64), strconv.FormatFloat(batches, 'f', 0, 64),
		lat(r.P50), lat(r.P90), lat(r.P99), lat(r.Max))
	return t.flush()
}
