package main

import (
	"log/slog"
	"runtime/metrics"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// limitToContainer sets the Go memory limit to 90% of the container's memory limit (its cgroup's, as
// provider reports it) when the operator set no GOMEMLIMIT; AUTOMEMLIMIT=off leaves it unset, and
// AUTOMEMLIMIT=0.8 (a ratio in (0, 1]) picks another share. Without a limit the heap may grow to twice the
// live heap between collections, more than a container sized for the state can hold: at a million leases
// 1.4 KB of RSS a lease against 450 B live, and an OOM kill rather than a harder-working collector. No
// cgroup limit, or none readable (not Linux), leaves the runtime as it was. leased sets no GOGC of its
// own: the operator's GOGC, or the runtime's 100, is what runs.
func limitToContainer(log *slog.Logger, provider memlimit.Provider) {
	if _, err := memlimit.Set(memlimit.WithProvider(provider), memlimit.WithLogger(log)); err != nil {
		log.Debug("no container memory limit applied", "err", err)
	}
}

// gcPercent is the GOGC the runtime runs with (-1 when GOGC=off), for the start-up log.
func gcPercent() int64 {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64()) // the runtime reports off as -1 in a uint64
}
