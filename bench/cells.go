package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/leased/leased/client/loadgen"
)

// A cell is one measurement on one freshly started cluster. It returns named values (metric keys, see
// rows.go); a failed cell returns its error and no values.
type cell struct {
	name string
	run  func(ctx context.Context, s system, cfg config) (map[string]float64, error)
}

// cells lists the cells of the selected rows, in the order they run.
func cells(cfg config) []cell {
	var out []cell
	if cfg.rows["acquire"] {
		for _, n := range cfg.clients {
			out = append(out, cell{fmt.Sprintf("acquire-%d", n), func(ctx context.Context, s system, cfg config) (map[string]float64, error) {
				return acquireCell(ctx, s, cfg, n)
			}})
		}
	}
	if cfg.rows["contended"] {
		out = append(out, cell{"contended", contendedCell})
	}
	if cfg.rows["renew"] {
		for _, n := range cfg.renewClients {
			out = append(out, cell{fmt.Sprintf("renew-%d", n), func(ctx context.Context, s system, cfg config) (map[string]float64, error) {
				return renewCell(ctx, s, cfg, n)
			}})
		}
	}
	if cfg.rows["read"] {
		for _, serializable := range []bool{true, false} {
			out = append(out, cell{readKey(serializable), func(ctx context.Context, s system, cfg config) (map[string]float64, error) {
				return readCell(ctx, s, cfg, serializable)
			}})
		}
	}
	if cfg.rows["batched"] {
		out = append(out, cell{"batched", batchedCell})
	}
	if cfg.rows["steady"] {
		out = append(out, cell{"steady", steadyCell})
	}
	if cfg.rows["failover"] {
		out = append(out, cell{"failover", failoverCell})
	}
	if cfg.rows["memory"] {
		for _, n := range cfg.leases {
			out = append(out, cell{memoryKey(n), func(ctx context.Context, s system, cfg config) (map[string]float64, error) {
				return memoryCell(ctx, s, cfg, n)
			}})
		}
	}
	return out
}

// opTimeout bounds every operation of a cell: a system that stops answering fails the operation rather
// than hanging the comparison.
const opTimeout = 10 * time.Second

// measure runs op for the cell's duration and checks that it did real work.
func measure(ctx context.Context, cfg config, clients int, op loadgen.Op) (loadgen.Result, error) {
	r, err := loadgen.Run(ctx, loadgen.Options{Clients: clients, Duration: cfg.duration, MaxOps: cfg.maxOps, OpTimeout: opTimeout}, op)
	if err != nil {
		return r, err
	}
	if r.Ops == r.Errors {
		return r, fmt.Errorf("all %d operations failed, the first with: %v", r.Ops, r.FirstErr)
	}
	return r, ctx.Err()
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// acquireCell measures acquires of fresh names by n clients, and the CPU the three nodes spent on them.
func acquireCell(ctx context.Context, s system, cfg config, n int) (map[string]float64, error) {
	op, err := s.acquire(ctx, n, 10*time.Second)
	if err != nil {
		return nil, err
	}
	before, err := nodesCPU(s)
	if err != nil {
		return nil, err
	}
	r, err := measure(ctx, cfg, n, op)
	if err != nil {
		return nil, err
	}
	after, err := nodesCPU(s)
	if err != nil {
		return nil, err
	}
	k := fmt.Sprintf("acquire-%d", n)
	return map[string]float64{
		k + "/rate": r.Rate(), k + "/p50": ms(r.P50), k + "/p99": ms(r.P99),
		k + "/cpu":    (after - before) / float64(r.Ops-r.Errors) * 1e6, // µs per acquire
		k + "/errors": float64(r.Errors),
	}, nil
}

// nodesCPU sums the CPU seconds of the three nodes.
func nodesCPU(s system) (float64, error) {
	var sum float64
	for _, p := range s.nodes() {
		c, err := cpuSeconds(p.pid())
		if err != nil {
			return 0, err
		}
		sum += c
	}
	return sum, nil
}

func contendedCell(ctx context.Context, s system, cfg config) (map[string]float64, error) {
	op, err := s.contended(ctx, cfg.contendedClients)
	if err != nil {
		return nil, err
	}
	r, err := measure(ctx, cfg, cfg.contendedClients, op)
	if err != nil {
		return nil, err
	}
	return map[string]float64{"contended/rate": r.Rate(), "contended/errors": float64(r.Errors)}, nil
}

func renewCell(ctx context.Context, s system, cfg config, n int) (map[string]float64, error) {
	op, err := s.renew(ctx, n)
	if err != nil {
		return nil, err
	}
	r, err := measure(ctx, cfg, n, op)
	if err != nil {
		return nil, err
	}
	k := fmt.Sprintf("renew-%d", n)
	return map[string]float64{k + "/rate": r.Rate(), k + "/errors": float64(r.Errors)}, nil
}

// readClients is the read rows' one client: they measure the floor under the one-client rows' latency.
const readClients = 1

func readKey(serializable bool) string {
	if serializable {
		return "read-serializable"
	}
	return "read-linearizable"
}

// readCell measures one client's reads of one key on the leader.
func readCell(ctx context.Context, s system, cfg config, serializable bool) (map[string]float64, error) {
	op, err := s.read(ctx, readClients, serializable)
	if err != nil {
		return nil, err
	}
	r, err := measure(ctx, cfg, readClients, op)
	if err != nil {
		return nil, err
	}
	k := readKey(serializable)
	return map[string]float64{k + "/rate": r.Rate(), k + "/p50": ms(r.P50), k + "/errors": float64(r.Errors)}, nil
}

// batchedCell measures renewals of many held leases in batches over keep-alive streams (one worker per
// stream), and the leader's CPU meanwhile (the node that serves them: renewals are leader reads).
func batchedCell(ctx context.Context, s system, cfg config) (map[string]float64, error) {
	op, err := s.keepAlive(ctx, cfg.batchStreams, cfg.batchLeases, cfg.batchSize)
	if err != nil {
		return nil, err
	}
	leader := s.leader(ctx)
	if leader < 0 {
		return nil, fmt.Errorf("no leader")
	}
	pid := s.nodes()[leader].pid()
	before, err := cpuSeconds(pid)
	if err != nil {
		return nil, err
	}
	r, err := measure(ctx, cfg, cfg.batchStreams, op)
	if err != nil {
		return nil, err
	}
	after, err := cpuSeconds(pid)
	if err != nil {
		return nil, err
	}
	renewals := float64((r.Ops - r.Errors) * cfg.batchSize)
	return map[string]float64{
		"batched/rate":   r.Rate() * float64(cfg.batchSize),
		"batched/cores":  (after - before) / r.Elapsed.Seconds(),
		"batched/cpu":    (after - before) / renewals * 1e6 * 1000, // µs per 1,000 renewals
		"batched/errors": float64(r.Errors),
	}, nil
}

// steadyCell runs cfg.steadyClients workers taking and releasing leases for cfg.steady and counts the
// elections meanwhile (the growth of the highest raft term): at full load and with no fault, any
// election is a spurious one — a leader whose heartbeats the load delayed past the election timeout.
func steadyCell(ctx context.Context, s system, cfg config) (map[string]float64, error) {
	op, err := s.churn(ctx, cfg.steadyClients)
	if err != nil {
		return nil, err
	}
	before, err := s.term(ctx)
	if err != nil {
		return nil, err
	}
	long := cfg
	long.duration, long.maxOps = cfg.steady, loadgen.MaxOpsLimit
	r, err := measure(ctx, long, cfg.steadyClients, op)
	if err != nil {
		return nil, err
	}
	after, err := s.term(ctx)
	if err != nil {
		return nil, err
	}
	return map[string]float64{
		"steady/elections": float64(after - before), "steady/rate": r.Rate(), "steady/errors": float64(r.Errors),
	}, nil
}

// fillOptions are those of taking n leases (loadgen.Fill): 64 workers, each call bounded by opTimeout,
// all of them by fillBound.
func fillOptions(n int) loadgen.Options {
	return loadgen.Options{Clients: loadgen.FillWorkers, Duration: fillBound, MaxOps: n, OpTimeout: opTimeout}
}

// fillBound bounds taking the leases of the batched-renewals row.
const fillBound = 10 * time.Minute

// failoverCell measures the leader's loss both ways, cfg.kills times each: SIGKILL (a crash: the
// followers must notice and elect) and SIGTERM (a clean stop: the leader hands leadership over first).
// Each time it measures how long from the signal until an acquire of a fresh name succeeds (each attempt
// bounded by 1 s, retried at once); the stopped node is restarted and waited for before the next one.
func failoverCell(ctx context.Context, s system, cfg config) (map[string]float64, error) {
	op, err := s.acquire(ctx, 1, 10*time.Second)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	seq := 0
	for _, way := range []struct {
		key  string
		stop func(*proc) <-chan struct{}
	}{{"failover", (*proc).killAsync}, {"handoff", (*proc).terminate}} {
		var gaps []float64
		for k := range cfg.kills {
			gap, err := leaderGap(ctx, s, op, &seq, way.stop)
			if err != nil {
				return nil, fmt.Errorf("%s %d: %w", way.key, k+1, err)
			}
			gaps = append(gaps, gap.Seconds())
		}
		slices.Sort(gaps)
		out[way.key+"/median"], out[way.key+"/max"] = median(gaps), gaps[len(gaps)-1]
	}
	return out, nil
}

// leaderGap stops the leader with stop, measures the time from the signal until op succeeds, and
// restarts the node once it has exited.
func leaderGap(ctx context.Context, s system, op loadgen.Op, seq *int, stop func(*proc) <-chan struct{}) (time.Duration, error) {
	var lead int
	if err := poll(ctx, 30*time.Second, func() bool { lead = s.leader(ctx); return lead >= 0 }); err != nil {
		return 0, fmt.Errorf("no leader: %w", err)
	}
	node := s.nodes()[lead]
	signalled := time.Now()
	exited := stop(node)
	var last error
	err := poll(ctx, 30*time.Second, func() bool {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		last = op(actx, 0, *seq)
		*seq++
		return last == nil
	})
	if err != nil {
		return 0, fmt.Errorf("no acquire succeeded: %w (last: %v)", err, last)
	}
	gap := time.Since(signalled)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		return 0, fmt.Errorf("%s did not exit within 30 s", node.name)
	}
	node.forget()
	if err := node.start(); err != nil {
		return 0, err
	}
	if err := waitReady(ctx, s, lead, 60*time.Second); err != nil {
		return 0, fmt.Errorf("restarted %s not ready: %w", node.name, err)
	}
	return gap, nil
}

// settle is how long the memory cell lets followers apply the last entries and the runtime return
// garbage before it reads RSS.
const settle = 3 * time.Second

func memoryKey(leases int) string { return fmt.Sprintf("memory-%d", leases) }

// memoryCell acquires n leases with 64 clients (TTL 1 h, so none expires), reads each node's RSS
// before and after, then SIGKILLs a follower and times its restart until it reports ready.
func memoryCell(ctx context.Context, s system, cfg config, n int) (map[string]float64, error) {
	before := make([]int64, 3)
	for i, p := range s.nodes() {
		var err error
		if before[i], err = rssBytes(p.pid()); err != nil {
			return nil, err
		}
	}
	const workers = 64
	op, err := s.acquire(ctx, workers, time.Hour)
	if err != nil {
		return nil, err
	}
	r, err := loadgen.Run(ctx, loadgen.Options{Clients: workers, Duration: cfg.fillTimeout, MaxOps: n, OpTimeout: opTimeout}, op)
	if err != nil {
		return nil, err
	}
	if held := r.Ops - r.Errors; held < n {
		return nil, fmt.Errorf("held %d of %d leases within %v (first error: %v)", held, n, cfg.fillTimeout, r.FirstErr)
	}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(settle):
	}
	var growth int64
	for i, p := range s.nodes() {
		after, err := rssBytes(p.pid())
		if err != nil {
			return nil, err
		}
		growth = max(growth, after-before[i])
	}
	lead := s.leader(ctx)
	if lead < 0 {
		return nil, fmt.Errorf("no leader after filling")
	}
	follower := (lead + 1) % 3
	node := s.nodes()[follower]
	node.kill()
	restarted := time.Now()
	if err := node.start(); err != nil {
		return nil, err
	}
	if err := waitReady(ctx, s, follower, 10*time.Minute); err != nil {
		return nil, fmt.Errorf("restarted %s not ready: %w", node.name, err)
	}
	k := memoryKey(n)
	return map[string]float64{
		k + "/growth-mb": float64(growth) / 1e6, k + "/per-lease": float64(growth) / float64(n),
		k + "/restart": time.Since(restarted).Seconds(),
	}, nil
}

func median(sorted []float64) float64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}
