package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/leased/leased/client/loadgen"
)

// system is one side of the comparison: a three-node cluster on loopback and the operations the rows
// measure on it. start and stop bracket every cell (a fresh cluster each time); the operations run in
// between.
type system interface {
	name() string
	// start launches three nodes with data under dir and returns once the cluster takes writes.
	start(ctx context.Context, dir string) error
	// stop SIGKILLs every node and closes the system's clients.
	stop()
	nodes() []*proc
	// acquire returns an Op that takes a lease on a fresh name per operation, as the system's users do.
	acquire(ctx context.Context, clients int, ttl time.Duration) (loadgen.Op, error)
	// contended returns an Op that waits for one shared lock and releases it: one handoff.
	contended(ctx context.Context, clients int) (loadgen.Op, error)
	// renew returns an Op that renews the worker's own lease once.
	renew(ctx context.Context, clients int) (loadgen.Op, error)
	// read returns an Op that reads one key (or lease) from the leader: linearizable, or serializable
	// (the leader's own state, without consensus).
	read(ctx context.Context, clients int, serializable bool) (loadgen.Op, error)
	// keepAlive holds leases leases and returns an Op that renews batch of them at once over the worker's
	// own keep-alive stream, as a client holding many leases does.
	keepAlive(ctx context.Context, workers, leases, batch int) (loadgen.Op, error)
	// churn returns an Op that takes a lease on a fresh name and releases it at once.
	churn(ctx context.Context, clients int) (loadgen.Op, error)
	// term is the highest raft term the running nodes report: it grows with every election.
	term(ctx context.Context) (uint64, error)
	// leader is the index of the node that leads (-1 if none answers as leader).
	leader(ctx context.Context) int
	// readyURL is the HTTP URL that answers 200 once node i is ready to serve.
	readyURL(i int) string
}

// waitReady polls s's node i's readiness URL until it answers 200 (or its readier check until it
// holds), for at most timeout.
func waitReady(ctx context.Context, s system, i int, timeout time.Duration) error {
	if r, ok := s.(readier); ok {
		return poll(ctx, timeout, func() bool { return r.ready(ctx, i) })
	}
	hc := &http.Client{Timeout: 500 * time.Millisecond}
	return poll(ctx, timeout, func() bool {
		resp, err := hc.Get(s.readyURL(i))
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// waitWritable runs op (a fresh acquire) until it succeeds, for at most timeout.
func waitWritable(ctx context.Context, op loadgen.Op, timeout time.Duration) error {
	var last error
	seq := 0
	err := poll(ctx, timeout, func() bool {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		last = op(actx, 0, seq)
		seq++
		return last == nil
	})
	if err != nil {
		return fmt.Errorf("%w (last error: %v)", err, last)
	}
	return nil
}

// pollInterval is how often poll checks its condition.
const pollInterval = 10 * time.Millisecond

// poll checks cond every pollInterval until it holds, ctx ends or timeout passes.
func poll(ctx context.Context, timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		if cond() {
			return nil
		}
		if !time.Now().Before(deadline) {
			return errors.New("timed out after " + timeout.String())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// highestTerm asks every running node (procs[i] at eps[i]) for its raft term, each within a second, and
// returns the highest.
func highestTerm(ctx context.Context, procs []*proc, eps []string, term func(context.Context, string) (uint64, error)) (uint64, error) {
	var hi uint64
	for i, ep := range eps {
		if !procs[i].running() {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		t, err := term(sctx, ep)
		cancel()
		if err != nil {
			return 0, err
		}
		hi = max(hi, t)
	}
	return hi, nil
}

// readier is a system whose nodes' readiness is no HTTP URL: waitReady asks ready instead.
type readier interface {
	ready(ctx context.Context, i int) bool
}

// notApplicableError is a cell with no fair equivalent on a system: the table shows its reason instead of
// a number.
type notApplicableError string

func (e notApplicableError) Error() string { return "n/a: " + string(e) }

func notApplicable(reason string) error { return notApplicableError(reason) }
