//go:build faultinject

package server

import (
	"sync/atomic"
	"time"
)

// Fault injection for the multi-process chaos harness, compiled only with -tags faultinject: cmd/leased
// then serves POST /debug/fault/disk-stall?duration=D on its admin address, which calls InjectDiskStall.

// diskFaults holds a stall for the next raft log write.
type diskFaults struct {
	stall atomic.Int64 // a time.Duration; 0: none
}

// beforeWrite blocks the write about to start for the pending stall, if any (counted by the disk watchdog
// as part of the write), or until stop closes.
func (f *diskFaults) beforeWrite(stop <-chan struct{}) {
	d := time.Duration(f.stall.Swap(0))
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-stop:
	}
}

// InjectDiskStall makes this node's next raft log write block for d before it writes, as a disk that
// stops answering; the writes after it wait behind it (the Ready loop writes one at a time). A stall
// longer than Config.DiskStallTimeout stops the node with ErrDiskStalled. A second call before the next
// write replaces the first.
func (s *Server) InjectDiskStall(d time.Duration) { s.node.faults.stall.Store(int64(d)) }
