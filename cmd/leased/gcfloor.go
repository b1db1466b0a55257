package main

import (
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// defaultGCMinHeap is --gc-min-heap-bytes' default: collections of a small heap wait until it is this big.
const defaultGCMinHeap = 256 << 20

// runtimeMinHeap is the Go runtime's smallest heap goal at GOGC=100. It scales with GOGC (4 MiB ×
// GOGC/100), so floorPercent caps GOGC where that reaches the floor.
const runtimeMinHeap = 4 << 20

// heapFloor lets the heap of a node that runs without a memory limit and without the operator's GOGC
// grow to at least floor bytes before a collection: after each collection it sets GOGC so that the next
// one comes at max(floor, twice the live heap). With the runtime's GOGC=100 alone a node with a small
// state collects once to a few times a second under load — the leader allocates about 6 KB an acquire — and
// on a small machine each cycle's marking and assists add milliseconds to the calls it overlaps
// (docs/benchmarks.md, "A floor under the heap"). Once the live heap passes floor/2 the floor no longer
// matters and the collector runs at GOGC=100, so a large state costs what it did; a small one costs at
// most floor bytes more.
//
// It runs no goroutine of its own: a finalizer on an object allocated for the purpose runs once the
// collection after it finds the object unreachable, and arms the next one.
type heapFloor struct {
	floor uint64

	mu      sync.Mutex // held by afterGC: once stop returns, the floor sets nothing more
	stopped bool
	live    []metrics.Sample
	percent int // the GOGC last set
}

// gcCycle is the object whose finalizer marks the end of a collection. It holds a pointer, so the
// runtime's tiny allocator (pointer-free objects under 16 bytes, which may never be freed alone) never
// takes it.
type gcCycle struct{ f *heapFloor }

// startHeapFloor sets the floor's GOGC for the current live heap and rearms after every collection.
func startHeapFloor(floor uint64) *heapFloor {
	f := &heapFloor{floor: floor, live: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}, percent: -1}
	f.afterGC()
	return f
}

// gcPercent is the GOGC the floor last set.
func (f *heapFloor) gcPercent() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.percent
}

// stop ends the floor and puts GOGC back to the runtime's default, which it was when the floor started
// (tuneGC starts one only without GOGC). Once it returns, the floor sets nothing more.
func (f *heapFloor) stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stopped = true
	debug.SetGCPercent(100)
}

// afterGC sets GOGC for the live heap the last collection found and arms itself for the next.
func (f *heapFloor) afterGC() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return
	}
	metrics.Read(f.live)
	if p := floorPercent(f.floor, f.live[0].Value.Uint64()); p != f.percent {
		debug.SetGCPercent(p)
		f.percent = p
	}
	runtime.SetFinalizer(&gcCycle{f}, func(c *gcCycle) { c.f.afterGC() })
}

// floorPercent is the GOGC whose heap goal for live bytes is floor — live×(1+p/100) = floor — but never
// below the runtime's default of 100, nor above where the runtime's own minimum goal (runtimeMinHeap ×
// p/100) passes floor. That minimum is the whole goal before the first collection (live 0), so then it
// is the ceiling itself: the first collection, too, waits for the floor.
func floorPercent(floor, live uint64) int {
	ceiling := float64(floor) / runtimeMinHeap * 100
	p := ceiling
	if live > 0 {
		p = min((float64(floor)/float64(live)-1)*100, ceiling)
	}
	return int(math.Ceil(max(p, 100)))
}
