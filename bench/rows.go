package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// row is one line of the output table: a metric both systems report, how to show it, and which way is
// better (the ratio is always "times better for leased": above 1, leased is ahead).
type row struct {
	label  string
	key    string
	format func(v float64) string
	higher bool // a higher value is better (rates); otherwise lower is (latency, time, memory, CPU)
}

func perSec(v float64) string  { return fmt.Sprintf("%.0f/s", v) }
func millis(v float64) string  { return fmt.Sprintf("%.2f ms", v) }
func seconds(v float64) string { return fmt.Sprintf("%.2f s", v) }
func micros(v float64) string  { return fmt.Sprintf("%.0f µs", v) }
func mbytes(v float64) string  { return fmt.Sprintf("+%.1f MB", v) }
func count(v float64) string   { return fmt.Sprintf("%.0f", v) }
func cores(v float64) string   { return fmt.Sprintf("%.2f cores", v) }
func bytes(v float64) string   { return fmt.Sprintf("%.0f B", v) }

// rows lists the table's rows for cfg, in the order.
func rows(cfg config) []row {
	var out []row
	if cfg.rows["acquire"] {
		for _, n := range cfg.clients {
			k, who := fmt.Sprintf("acquire-%d", n), plural(n, "client")
			out = append(out,
				row{"acquire, " + who + ": rate", k + "/rate", perSec, true},
				row{"acquire, " + who + ": p50", k + "/p50", millis, false},
				row{"acquire, " + who + ": p99", k + "/p99", millis, false})
		}
	}
	if cfg.rows["contended"] {
		out = append(out, row{fmt.Sprintf("contended: %s, one resource, wait + release (handoffs)", plural(cfg.contendedClients, "client")),
			"contended/rate", perSec, true})
	}
	if cfg.rows["renew"] {
		for _, n := range cfg.renewClients {
			out = append(out, row{"unary renew, " + plural(n, "client"), fmt.Sprintf("renew-%d/rate", n), perSec, true})
		}
	}
	if cfg.rows["read"] {
		for _, r := range []struct{ key, what string }{
			{"read-serializable", "serializable (the leader's own state: one client round trip)"},
			{"read-linearizable", "linearizable (after a ReadIndex round: a renewal's work)"},
		} {
			out = append(out,
				row{"read, 1 client, " + r.what + ": rate", r.key + "/rate", perSec, true},
				row{"read, 1 client, " + r.what + ": p50", r.key + "/p50", millis, false})
		}
	}
	if cfg.rows["batched"] {
		what := fmt.Sprintf("batched renewals (%d leases, %d per batch, %s)", cfg.batchLeases, cfg.batchSize, plural(cfg.batchStreams, "stream"))
		out = append(out,
			row{what + ": rate", "batched/rate", perSec, true},
			row{what + ": leader CPU", "batched/cores", cores, false},
			row{what + ": leader CPU per 1,000", "batched/cpu", micros, false})
	}
	if cfg.rows["steady"] {
		what := fmt.Sprintf("steady load (%s taking and releasing leases, %v)", plural(cfg.steadyClients, "client"), cfg.steady)
		out = append(out,
			row{what + ": elections", "steady/elections", count, false},
			row{what + ": rate", "steady/rate", perSec, true})
	}
	if cfg.rows["failover"] {
		out = append(out,
			row{fmt.Sprintf("leader SIGKILL → next acquire (%s): median", plural(cfg.kills, "kill")), "failover/median", seconds, false},
			row{fmt.Sprintf("leader SIGKILL → next acquire (%s): max", plural(cfg.kills, "kill")), "failover/max", seconds, false},
			row{fmt.Sprintf("leader SIGTERM → next acquire (%s): median", plural(cfg.kills, "stop")), "handoff/median", seconds, false},
			row{fmt.Sprintf("leader SIGTERM → next acquire (%s): max", plural(cfg.kills, "stop")), "handoff/max", seconds, false})
	}
	if cfg.rows["memory"] {
		for _, l := range cfg.leases {
			n, k := fmt.Sprintf("%d held leases", l), memoryKey(l)
			out = append(out,
				row{"RSS growth per node (largest of 3), " + n, k + "/growth-mb", mbytes, false},
				row{"RSS growth per held lease per node, " + n, k + "/per-lease", bytes, false},
				row{"restart of a follower → ready, " + n, k + "/restart", seconds, false})
		}
	}
	if cfg.rows["acquire"] {
		for _, n := range cfg.clients {
			out = append(out, row{"CPU per acquire (3 nodes), " + plural(n, "client"), fmt.Sprintf("acquire-%d/cpu", n), micros, false})
		}
	}
	return out
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// results holds every repetition's values, vals[system][key] one value per successful cell, and the
// cells a system has no fair equivalent of, na[system][cell] their reason.
type results struct {
	vals map[string]map[string][]float64
	na   map[string]map[string]string
}

func newResults() results {
	return results{vals: map[string]map[string][]float64{}, na: map[string]map[string]string{}}
}

func (r results) add(system string, vals map[string]float64) {
	if r.vals[system] == nil {
		r.vals[system] = map[string][]float64{}
	}
	for k, v := range vals {
		r.vals[system][k] = append(r.vals[system][k], v)
	}
}

func (r results) notApplicable(system, cell, reason string) {
	if r.na[system] == nil {
		r.na[system] = map[string]string{}
	}
	r.na[system][cell] = reason
}

// show is a system's entry for the row of key: its values, or why it has none.
func (r results) show(system string, rw row) string {
	vals := r.vals[system][rw.key]
	cell, _, _ := strings.Cut(rw.key, "/")
	if reason, ok := r.na[system][cell]; ok && len(vals) == 0 {
		return "n/a: " + reason
	}
	return span(vals, rw.format)
}

// span shows a metric's values across repetitions: "v" when they agree, "min–max" otherwise, "—"
// without any.
func span(vals []float64, format func(float64) string) string {
	if len(vals) == 0 {
		return "—"
	}
	lo, hi := slices.Min(vals), slices.Max(vals)
	if format(lo) == format(hi) {
		return format(lo)
	}
	return format(lo) + " – " + format(hi)
}

// ratio is how many times better leased's median is than a peer's.
func ratio(peer, leased []float64, higher bool) string {
	if len(peer) == 0 || len(leased) == 0 {
		return "—"
	}
	e, l := medianOf(peer), medianOf(leased)
	if higher {
		e, l = l, e
	}
	if l <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f×", e/l)
}

func medianOf(vals []float64) float64 {
	s := slices.Clone(vals)
	slices.Sort(s)
	return median(s)
}

// writeTable prints the markdown table of res: a column per system run, then leased's ratio against
// each peer run beside it.
func writeTable(w io.Writer, cfg config, res results) {
	var systems, peers []string
	for _, sys := range allSystems {
		if cfg.systems[sys] {
			systems = append(systems, sys)
			if sys != "leased" && cfg.systems["leased"] {
				peers = append(peers, sys)
			}
		}
	}
	head := append([]string{"workload"}, systems...)
	for _, p := range peers {
		head = append(head, "leased vs "+p)
	}
	fmt.Fprintf(w, "| %s |\n|%s\n", strings.Join(head, " | "), strings.Repeat("---|", len(head)))
	for _, r := range rows(cfg) {
		line := []string{r.label}
		for _, sys := range systems {
			line = append(line, res.show(sys, r))
		}
		for _, p := range peers {
			line = append(line, ratio(res.vals[p][r.key], res.vals["leased"][r.key], r.higher))
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(line, " | "))
	}
	fmt.Fprintln(w, "\nRatios: times better for leased (>1: leased ahead), from the medians.")
	var errs []string
	for _, sys := range systems {
		for k, v := range res.vals[sys] {
			if strings.HasSuffix(k, "/errors") && slices.Max(v) > 0 {
				errs = append(errs, fmt.Sprintf("%s %s: %.0f", sys, strings.TrimSuffix(k, "/errors"), slices.Max(v)))
			}
		}
	}
	slices.Sort(errs)
	if len(errs) > 0 {
		fmt.Fprintf(w, "\nFailed operations (most in one repetition): %s\n", strings.Join(errs, "; "))
	}
}
