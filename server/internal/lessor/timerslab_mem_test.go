package lessor

import (
	"runtime"
	"testing"
	"unsafe"
)

// BenchmarkTimerSlabMemory reports the heap a slab of n timers holds after a collection, per timer
// (B/timer), and the part of it beyond the chunks (index-B/timer: the token index). The numbers beside
// timerSlab come from it. Run: go test -run '^$' -bench TimerSlabMemory -benchtime 1x ./server/internal/lessor/
func BenchmarkTimerSlabMemory(b *testing.B) {
	for _, c := range []struct {
		name string
		n    int
	}{{"100k", 100_000}, {"700k", 700_000}, {"1M", 1_000_000}} {
		b.Run(c.name, func(b *testing.B) {
			for range b.N {
				before := heapInUse()
				var s timerSlab
				for i := range c.n {
					s.add(leaseTimer{token: uint64(i + 1)})
				}
				total := heapInUse() - before
				chunks := int64(len(s.chunks)*slabChunk) * int64(unsafe.Sizeof(leaseTimer{}))
				runtime.KeepAlive(&s)
				b.ReportMetric(float64(total)/float64(c.n), "B/timer")
				b.ReportMetric(float64(total-chunks)/float64(c.n), "index-B/timer")
			}
		})
	}
}
