package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/leased/leased/client"
	"github.com/leased/leased/client/loadgen"
)

// benchFailover runs bench failover: one worker acquiring continuously while the operator stops the
// leader, each outage told on stderr as it starts and ends; then prints the outages.
func (a *app) benchFailover(ctx context.Context, f benchFlags, interrupted func() bool) error {
	pool, err := loadgen.NewPool(client.Config{
		Endpoints: a.endpoints, TLS: a.tlsConfig, DialTimeout: a.timeout, RequestTimeout: a.timeout,
	}, 1)
	if err != nil {
		return err
	}
	defer pool.Close()
	events := loadgen.Failover{
		Gap: f.gap,
		OnServing: func() {
			a.warnf("acquiring for %v: stop, kill or partition the leader now (an outage: no acquire for more than %v)", f.duration, f.gap)
		},
		OnDown: func(o loadgen.Outage) {
			a.warnf("outage: no acquire since %s (%v into the run)", o.At.Format(timestampLayout), dur(o.Start))
		},
		OnUp: func(o loadgen.Outage) {
			a.warnf("outage over: %v without an acquire since %s (%s failed)", dur(o.Length), o.At.Format(timestampLayout), plural(o.Errors, "acquire"))
		},
	}
	// Each acquire (and its release) is bounded by --timeout, as every other request of leasectl is.
	r, err := pool.Failover(ctx, loadgen.Options{Duration: f.duration, MaxOps: f.maxOps, OpTimeout: a.timeout},
		f.resources+"/failover", f.ttl, events)
	if err != nil {
		return err
	}
	if err := a.printFailover(f, r); err != nil {
		return err
	}
	return failoverOutcome(r, interrupted())
}

// failoverOutcome is failover's error after printing: errInterrupted after Ctrl-C; the first error's own
// when no acquire succeeded; exit 1 when the run ended during an outage (the cluster had not come back).
// Failed acquires are what an outage is made of: they do not fail the run.
func failoverOutcome(r loadgen.FailoverResult, interrupted bool) error {
	switch n := len(r.Outages); {
	case interrupted:
		return errInterrupted
	case r.Errors > 0 && r.Errors == r.Ops:
		return fmt.Errorf("all %d acquires failed, the first with: %w", r.Ops, r.FirstErr)
	case n > 0 && !r.Outages[n-1].Ended:
		return fmt.Errorf("the run ended during an outage: no acquire for its last %v", dur(r.Outages[n-1].Length))
	}
	return nil
}

func (a *app) printFailover(f benchFlags, r loadgen.FailoverResult) error {
	msf := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	if a.jsonOut() {
		j := failoverJSON{
			Workload: "failover", GapMs: msf(f.gap), DurationMs: r.Elapsed.Milliseconds(), Ops: r.Ops, Errors: r.Errors,
			ReleaseErrors: r.ReleaseErrors, Outages: []outageJSON{},
			OutageMedianMs: msf(r.OutageMedian()), OutageMaxMs: msf(r.OutageMax()),
		}
		for _, o := range r.Outages {
			oj := outageJSON{StartMs: msf(o.Start), StartedAt: o.At.Format(timestampLayout), LengthMs: msf(o.Length), Ended: o.Ended, Errors: o.Errors}
			if o.FirstErr != nil {
				oj.FirstError = message(o.FirstErr)
			}
			j.Outages = append(j.Outages, oj)
		}
		if r.FirstErr != nil {
			j.FirstError = message(r.FirstErr)
		}
		return a.emitJSON(j)
	}
	t := a.newTable("WORKLOAD", "DURATION", "GAP", "OPS", "ERRORS", "OUTAGES", "MEDIAN", "MAX")
	t.row("failover", dur(r.Elapsed), f.gap.String(), strconv.Itoa(r.Ops), strconv.Itoa(r.Errors), strconv.Itoa(len(r.Outages)),
		dur(r.OutageMedian()), dur(r.OutageMax()))
	if err := t.flush(); err != nil {
		return err
	}
	if len(r.Outages) == 0 {
		return nil
	}
	a.outMu.Lock()
	_, err := fmt.Fprintln(a.stdout)
	a.outMu.Unlock()
	if err != nil {
		return err
	}
	t = a.newTable("OUTAGE", "STARTED", "AFTER", "LENGTH", "ERRORS", "ENDED")
	for i, o := range r.Outages {
		ended := "yes"
		if !o.Ended {
			ended = "no (the run ended)"
		}
		t.row(strconv.Itoa(i+1), o.At.Format(timestampLayout), dur(o.Start), dur(o.Length), strconv.Itoa(o.Errors), ended)
	}
	return t.flush()
}

// plural is "1 acquire", "2 acquires".
func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}
