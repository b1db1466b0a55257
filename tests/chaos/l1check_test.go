package chaos

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/leased/leased/tests/internal/proc"
)

// ---- L1: a healthy majority never costs a client its lease ----

// l1Grace is how long after a fault ends its effects are still attributed to it: a lease is lost up to
// a TTL after the renewals stopped being answered, and an acquire may be slow until the clients found
// the new leader.
const l1Grace = leaseTTL + time.Second

// l1Aftermath is how long a leader fault still disturbs leadership after it ends: the next election
// (or the old leader's return and step-down) takes up to two election timeouts.
const l1Aftermath = 2 * proc.ElectionTimeout

// l1Row is what one kind of nemesis cost the clients.
type l1Row struct {
	Injected     int
	Lost         int           // leases (TTL ≥ floor) lost in a majority window with at most one leader fault
	LostTwice    int           // lost while two or more leader faults fell in the lease's last TTL (reported only)
	SlowAcquires int           // acquires of a free resource over electionBound (or failed)
	MaxAcquire   time.Duration // longest time to a grant of a free resource
	MaxStall     time.Duration // longest single client call (any outcome), called during the fault
}

// l1Report is L1's summary per nemesis ("none": nothing injected at that moment).
type l1Report struct {
	Rows            map[string]*l1Row
	Leases, Acquire int // leases and acquires checked
}

func (r l1Report) String() string {
	var b strings.Builder
	var names []string
	for n := range r.Rows {
		names = append(names, n)
	}
	slices.Sort(names)
	fmt.Fprintf(&b, "    %d leases, %d acquires of free resources checked\n", r.Leases, r.Acquire)
	fmt.Fprintf(&b, "    %-26s %8s %11s %17s %13s %12s %12s\n", "nemesis", "injected", "leases lost",
		"lost (2+ faults)", "slow acquires", "max acquire", "max stall")
	for _, n := range names {
		x := r.Rows[n]
		fmt.Fprintf(&b, "    %-26s %8d %11d %17d %13d %12v %12v\n", n, x.Injected, x.Lost, x.LostTwice, x.SlowAcquires,
			x.MaxAcquire.Round(time.Millisecond), x.MaxStall.Round(time.Millisecond))
	}
	return b.String()
}

// majorityUp reports whether, at every instant of [from, to], the nodes that no fault of the nemesis log
// impairs are a majority. A fault impairs the nodes it names (Nodes) from its Start to its End; faults on
// clients (a paused holder, a black-holed client link) impair no node. That remaining majority is up and
// mutually reachable, since every fault in the log names each node it touches.
func majorityUp(nodes int, nems []nemesisRec, end, from, to time.Duration) bool {
	instants := []time.Duration{from, to}
	for _, n := range nems {
		if n.Start > from && n.Start < to {
			instants = append(instants, n.Start)
		}
	}
	for _, t := range instants {
		impaired := map[int]bool{}
		for _, n := range nems {
			stop := n.End
			if stop < 0 {
				stop = end
			}
			if n.Start <= t && t <= stop {
				for _, i := range n.Nodes {
					impaired[i] = true
				}
			}
		}
		if nodes-len(impaired) < nodes/2+1 {
			return false
		}
	}
	return true
}

// leaderFaults counts the faults on a leader (a node fault whose name says it hit the leader) that
// disturbed leadership at some point of [from, to]: each from its start to l1Aftermath after its end.
func leaderFaults(nems []nemesisRec, end, from, to time.Duration) int {
	n := 0
	for _, f := range nems {
		stop := f.End
		if stop < 0 {
			stop = end
		}
		if len(f.Nodes) > 0 && strings.Contains(f.Name, "leader") && f.Start <= to && stop+l1Aftermath >= from {
			n++
		}
	}
	return n
}

// attribute names the fault an effect at t belongs to: the latest that began at or before t and ended
// no more than l1Grace before it; "none" otherwise.
func attribute(nems []nemesisRec, end, t time.Duration) string {
	name := "none"
	for _, n := range nems {
		stop := n.End
		if stop < 0 {
			stop = end
		}
		if n.Start <= t && t <= stop+l1Grace {
			name = n.Name
		}
	}
	return name
}

// checkL1 checks L1 over the workload's period (up to end): while a majority is up and reachable (the
// whole interval an effect depends on: a lease's last TTL before it was lost, an acquire's whole wait),
// no lease with TTL ≥ floor is lost — it ended with lost-contact or expired while its holder kept
// renewing — and every acquire of a free resource is granted within electionBound. The floor promises
// to ride out one leader failure per TTL (docs/client.md): a lease lost while two or more leader faults
// fell in its last TTL is counted in LostTwice and reported, not a violation. It also reports, per
// nemesis, the longest client call (ops) begun while the fault was on.
func checkL1(nodes int, floor, end time.Duration, nems []nemesisRec, leases []l1Lease, acqs []l1Acquire, ops []op) (l1Report, []string) {
	rep := l1Report{Rows: map[string]*l1Row{"none": {}}}
	row := func(name string) *l1Row {
		if rep.Rows[name] == nil {
			rep.Rows[name] = &l1Row{}
		}
		return rep.Rows[name]
	}
	for _, n := range nems {
		row(n.Name).Injected++
	}
	var v []string
	for _, l := range leases {
		if l.TTL < floor || l.Ended < 0 || l.Ended > end {
			continue
		}
		rep.Leases++
		if !lostReason(l.Reason) {
			continue
		}
		from := max(l.Acquired, l.Ended-l.TTL)
		if !majorityUp(nodes, nems, end, from, l.Ended) {
			continue
		}
		name := attribute(nems, end, l.Ended)
		if leaderFaults(nems, end, from, l.Ended) >= 2 {
			row(name).LostTwice++
			continue
		}
		row(name).Lost++
		v = append(v, fmt.Sprintf("L1: %s lost %s/%d (TTL %v) at %v: %s, during %s", l.Holder, l.Resource, l.Token, l.TTL,
			l.Ended.Round(time.Millisecond), l.Reason, name))
	}
	for _, a := range acqs {
		if a.Start+a.Took > end {
			continue
		}
		rep.Acquire++
		if !majorityUp(nodes, nems, end, a.Start, a.Start+a.Took) {
			continue
		}
		name := attribute(nems, end, a.Start)
		x := row(name)
		x.MaxAcquire = max(x.MaxAcquire, a.Took)
		if !a.OK || a.Took > electionBound {
			x.SlowAcquires++
			v = append(v, fmt.Sprintf("L1: %s's acquire of free %s at %v: %s after %v (bound %v), during %s", a.Holder, a.Resource,
				a.Start.Round(time.Millisecond), map[bool]string{true: "granted", false: "not granted"}[a.OK], a.Took.Round(time.Millisecond), electionBound, name))
		}
	}
	for _, o := range ops {
		if time.Duration(o.Call) > end {
			continue
		}
		x := row(attribute(nems, end, time.Duration(o.Call)))
		x.MaxStall = max(x.MaxStall, time.Duration(o.Return-o.Call))
	}
	return rep, v
}

// writeNemesisLog writes the nemesis log, one fault a line: start, end, name, impaired nodes, clients.
func writeNemesisLog(nems []nemesisRec, path string) {
	var b strings.Builder
	for _, n := range nems {
		var nodes []string
		for _, i := range n.Nodes {
			nodes = append(nodes, fmt.Sprintf("n%d", i+1))
		}
		fmt.Fprintf(&b, "%10.3f %10.3f %-24s nodes=[%s] clients=[%s] %s\n", n.Start.Seconds(), n.End.Seconds(), n.Name,
			strings.Join(nodes, ","), strings.Join(n.Clients, ","), n.Note)
	}
	_ = os.WriteFile(path, []byte(b.String()), 0o644)
}
