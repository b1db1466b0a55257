package main

import (
	"log/slog"
	"math"
	"runtime/debug"
	"strconv"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// limitToContainer sets the Go memory limit to 90% of the container's memory limit (its cgroup's, as
// provider reports it) when the operator set no GOMEMLIMIT; AUTOMEMLIMIT=off leaves it unset, and
// AUTOMEMLIMIT=0.8 (a ratio in (0, 1]) picks another share. Without a limit the heap may grow to twice the
// live heap between collections, more than a container sized for the state can hold: at a million leases
// 1.4 KB of RSS a lease against 450 B live, and an OOM kill rather than a harder-working collector. With
// the limit in effect, tuneGC raises GOGC as for a GOMEMLIMIT. No cgroup limit, or none readable (not
// Linux), leaves the runtime as it was.
func limitToContainer(log *slog.Logger, provider memlimit.Provider) {
	if _, err := memlimit.Set(memlimit.WithProvider(provider), memlimit.WithLogger(log)); err != nil {
		log.Debug("no container memory limit applied", "err", err)
	}
}

// gcPercentUnderLimit is the GOGC leased runs with when the operator gave the process a memory limit
// (GOMEMLIMIT) and chose no GOGC. At the runtime's default of 100 the heap may only double between
// collections, whatever the limit allows: with a large state on a small machine a collection is then
// nearly always running, and its workers starve the Ready loop now and then (docs/benchmarks.md,
// "Snapshots beside the Ready loop": 0.4–1.1 s stalls at 1M leases on two cores, none at 400). Under a
// limit the collector still runs as the heap nears it, so a higher GOGC spends memory the operator
// budgeted, not more.
const gcPercentUnderLimit = 400

// gcSettings is what tuneGC put in effect, for the start-up log.
type gcSettings struct {
	percent int        // GOGC in effect (-1: off), at start; a heap floor changes it after every collection
	limit   int64      // the memory limit in effect; math.MaxInt64: none
	set     bool       // leased chose percent (gcPercentUnderLimit, or the heap floor's)
	floor   int64      // the heap floor leased keeps; 0: none
	heap    *heapFloor // which keeps it; nil: none
}

// tuneGC applies gcPercent's verdict to the runtime, or, with neither a memory limit nor GOGC, a heap
// floor of minHeap bytes (0: none), and returns what is in effect.
func tuneGC(getenv func(string) string, minHeap int64) gcSettings {
	var g gcSettings
	g.limit = debug.SetMemoryLimit(-1) // reads the limit in effect (GOMEMLIMIT or an earlier call)
	g.percent, g.set = gcPercent(g.limit, getenv("GOGC"))
	switch {
	case g.set:
		debug.SetGCPercent(g.percent)
	case getenv("GOGC") == "" && g.limit == math.MaxInt64 && minHeap > 0:
		g.heap, g.floor = startHeapFloor(uint64(minHeap)), minHeap
		g.percent, g.set = g.heap.gcPercent(), true
	}
	return g
}

// gcPercent is the GOGC leased sets (set true) given the memory limit in effect and the GOGC variable:
// gcPercentUnderLimit under a limit when GOGC is unset, nothing otherwise (percent is then what the
// runtime runs with, -1 for off).
func gcPercent(limit int64, gogc string) (percent int, set bool) {
	switch {
	case gogc == "off":
		return -1, false
	case gogc != "":
		if p, err := strconv.Atoi(gogc); err == nil {
			return p, false
		}
		return 100, false // the runtime ignores a GOGC it cannot parse
	case limit < math.MaxInt64:
		return gcPercentUnderLimit, true
	default:
		return 100, false
	}
}
