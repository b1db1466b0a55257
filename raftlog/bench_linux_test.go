//go:build linux

package raftlog

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// BenchmarkRawFdatasync is the floor BenchmarkSave is measured against: a
// 4 KiB write plus fdatasync on a file in the same kind of directory.
func BenchmarkRawFdatasync(b *testing.B) {
	f, err := os.Create(filepath.Join(b.TempDir(), "raw"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	b.ResetTimer()
	for i := range b.N {
		if _, err := f.WriteAt(buf, int64(i%256)*4096); err != nil {
			b.Fatal(err)
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "syncs/s")
}
