package raftlog

import (
	"fmt"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

// BenchmarkSave measures one Save per Ready with batches of 128-byte
// entries, as the leader's Ready loop issues them, compacting now and then
// so the WAL stays at a steady size (Compact deletes whole segments).
// Count fsyncs per Save (one fdatasync; bbolt took two) with
//
//	strace -f -c -e trace=fdatasync,fsync ./raftlog.test -test.run='^$' -test.bench=BenchmarkSave/entries=16,
//
// The last case is a Ready of a leader's idle checkpoints after a mass
// disconnect: a thousand entries of 25 KiB (a thousand leases each).
func BenchmarkSave(b *testing.B) {
	for _, c := range []struct{ n, size int }{{1, 128}, {16, 128}, {256, 128}, {1000, 25 << 10}} {
		b.Run(fmt.Sprintf("entries=%d,bytes=%d", c.n, c.size), func(b *testing.B) {
			n := c.n
			s, err := Open(b.TempDir(), testID)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			data := make([]byte, c.size)
			next := uint64(1)
			b.ResetTimer()
			for range b.N {
				ents := make([]*raftpb.Entry, n)
				for k := range ents {
					ents[k] = &raftpb.Entry{Index: new(next), Term: new(uint64(1)), Data: data}
					next++
				}
				if err := s.Save(hardState(1, 1, next-1), ents, nil); err != nil {
					b.Fatal(err)
				}
				if next > 100_000 && next%50_000 < uint64(n) {
					if err := s.Compact(next - 10_000); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "entries/s")
		})
	}
}
