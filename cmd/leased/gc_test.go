package main

import (
	"io"
	"log/slog"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

func TestGCPercentIsRaisedOnlyUnderALimitWithoutGOGC(t *testing.T) {
	for _, c := range []struct {
		limit   int64
		gogc    string
		percent int
		set     bool
	}{
		{math.MaxInt64, "", 100, false},          // no limit: the runtime's default
		{4 << 30, "", gcPercentUnderLimit, true}, // a limit, no GOGC: collect less often
		{4 << 30, "50", 50, false},               // the operator's GOGC wins
		{4 << 30, "off", -1, false},              // so does GOGC=off
		{math.MaxInt64, "200", 200, false},       // GOGC without a limit
		{4 << 30, "many", 100, false},            // unparsable: the runtime's default, left alone
	} {
		percent, set := gcPercent(c.limit, c.gogc)
		if percent != c.percent || set != c.set {
			t.Errorf("gcPercent(%d, %q) = %d, %v; want %d, %v", c.limit, c.gogc, percent, set, c.percent, c.set)
		}
	}
}

// A container's memory limit becomes 90% of it as the Go memory limit, unless the operator set
// GOMEMLIMIT or AUTOMEMLIMIT=off; AUTOMEMLIMIT picks another share; no container limit changes nothing.
func TestContainerLimitBecomesTheMemoryLimit(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	const container = 1 << 30
	for _, c := range []struct {
		name, gomemlimit, automemlimit string
		provider                       memlimit.Provider
		want                           int64
	}{
		{"container limit", "", "", memlimit.Limit(container), container * 9 / 10},
		{"another share", "", "0.5", memlimit.Limit(container), container / 2},
		{"GOMEMLIMIT set", "3GiB", "", memlimit.Limit(container), 123 << 20},
		{"turned off", "", "off", memlimit.Limit(container), 123 << 20},
		{"no container limit", "", "", func() (uint64, error) { return 0, memlimit.ErrNoLimit }, math.MaxInt64},
	} {
		debug.SetMemoryLimit(123 << 20) // what the runtime would have: leased must leave it, or replace it
		t.Setenv("GOMEMLIMIT", c.gomemlimit)
		t.Setenv("AUTOMEMLIMIT", c.automemlimit)
		if c.automemlimit == "" {
			unsetenv(t, "AUTOMEMLIMIT")
		}
		limitToContainer(log, c.provider)
		if got := debug.SetMemoryLimit(-1); got != c.want {
			t.Errorf("%s: memory limit %d, want %d", c.name, got, c.want)
		}
	}
}

// unsetenv removes key from the environment for the rest of the test (t.Setenv restores it afterwards).
func unsetenv(t *testing.T, key string) {
	t.Helper()
	t.Setenv(key, "")
	if err := os.Unsetenv(key); err != nil {
		t.Fatal(err)
	}
}

func TestFloorPercent(t *testing.T) {
	const floor = 256 << 20
	for _, c := range []struct {
		live uint64
		want int
	}{
		{0, 6400},          // no collection yet: the first waits for the floor too (4 MiB × 64)
		{floor, 100},       // a live heap at the floor: GOGC=100
		{floor / 2, 100},   // at half of it the doubling reaches the floor
		{floor / 4, 300},   // below, the goal is the floor: 64 MiB × 4
		{floor / 8, 700},   // 32 MiB × 8
		{1 << 20, 6400},    // capped where the runtime's minimum goal (4 MiB × GOGC/100) reaches the floor
		{3 * floor, 100},   // far above: GOGC=100
		{floor/3 + 1, 200}, // rounded up, so the goal is never below the floor
	} {
		if got := floorPercent(floor, c.live); got != c.want {
			t.Errorf("floorPercent(256 MiB, %d) = %d, want %d", c.live, got, c.want)
		}
	}
}

// After every collection the heap floor sets GOGC for the live heap the collection found; stopped, it
// puts GOGC back to 100 and leaves it there.
func TestHeapFloorSetsGOGCAfterEachCollection(t *testing.T) {
	prev := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(prev) })
	const floor = 1 << 30
	f := startHeapFloor(floor)
	runtime.GC()
	small := gogc() // for a live heap of a few MiB: the cap, 25,600

	// A live heap of 128 MiB more: the next collection's finalizer must lower GOGC to about 700.
	ballast := make([]byte, 128<<20)
	for i := range ballast {
		ballast[i] = 1 // touched, so that it is really there
	}
	deadline := time.Now().Add(10 * time.Second)
	for gogc() == small { // the finalizer runs on its own goroutine after the collection: poll
		if time.Now().After(deadline) {
			t.Fatalf("GOGC still %d after collections with 128 MiB more live heap", small)
		}
		runtime.GC()
	}
	if got, want := gogc(), uint64(floorPercent(floor, liveHeap())); got < want*9/10 || got > want*11/10 {
		t.Errorf("GOGC %d for a live heap of %d bytes under a 1 GiB floor; want about %d", got, liveHeap(), want)
	}
	runtime.KeepAlive(ballast) // garbage from here on: the live heap falls by 128 MiB

	f.stop()
	runtime.GC()
	runtime.GC()
	if got := gogc(); got != 100 {
		t.Errorf("GOGC %d after the floor stopped and the live heap fell; want 100", got)
	}
}

func gogc() uint64 {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// Only a process with neither a memory limit nor GOGC gets the floor; --gc-min-heap-bytes=0 turns it off.
func TestHeapFloorOnlyWithoutLimitOrGOGC(t *testing.T) {
	prevPercent, prevLimit := debug.SetGCPercent(100), debug.SetMemoryLimit(math.MaxInt64)
	t.Cleanup(func() { debug.SetGCPercent(prevPercent); debug.SetMemoryLimit(prevLimit) })
	for _, c := range []struct {
		name    string
		limit   int64
		gogc    string
		minHeap int64
		floor   bool
	}{
		{"no limit, no GOGC", math.MaxInt64, "", 256 << 20, true},
		{"turned off", math.MaxInt64, "", 0, false},
		{"GOGC set", math.MaxInt64, "100", 256 << 20, false},
		{"a memory limit", 4 << 30, "", 256 << 20, false},
	} {
		debug.SetMemoryLimit(c.limit)
		g := tuneGC(func(k string) string { return map[string]string{"GOGC": c.gogc}[k] }, c.minHeap)
		if (g.heap != nil) != c.floor || (g.floor != 0) != c.floor {
			t.Errorf("%s: floor %d (%v), want one: %v", c.name, g.floor, g.heap, c.floor)
		}
		if g.heap != nil {
			g.heap.stop()
		}
		debug.SetGCPercent(100) // what gcPercent set under the limit
	}
}
