//go:build faultinject

package server

import (
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"time"
)

// Fault injection for the multi-process chaos harness, compiled only with -tags faultinject: cmd/leased
// then serves POST /debug/fault/disk-stall?duration=D and POST /debug/fault/disk-error?errno=E on its
// admin address, which call InjectDiskStall and InjectDiskError.

// diskFaults holds a stall or an error for the next raft log write.
type diskFaults struct {
	stall atomic.Int64   // a time.Duration; 0: none
	errno atomic.Uintptr // a syscall.Errno; 0: none
}

// beforeWrite blocks the write about to start for the pending stall, if any (counted by the disk watchdog
// as part of the write), or until stop closes. It then returns the pending error, if any, naming path
// (the file the write was to go to) as a failed write(2) would: the write is then not made.
func (f *diskFaults) beforeWrite(stop <-chan struct{}, path func() string) error {
	if d := time.Duration(f.stall.Swap(0)); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-stop:
		}
	}
	if e := syscall.Errno(f.errno.Swap(0)); e != 0 {
		return fmt.Errorf("raftlog: %w", &os.PathError{Op: "write", Path: path(), Err: e})
	}
	return nil
}

// InjectDiskStall makes this node's next raft log write block for d before it writes, as a disk that
// stops answering; the writes after it wait behind it (the Ready loop writes one at a time). A stall
// longer than Config.DiskStallTimeout stops the node with ErrDiskStalled. A second call before the next
// write replaces the first.
func (s *Server) InjectDiskStall(d time.Duration) { s.node.faults.stall.Store(int64(d)) }

// InjectDiskError makes this node's next raft log write fail with errno (syscall.EIO: a failing disk;
// syscall.ENOSPC: a full one) without writing, as the write(2) would; the node then stops (decision 13).
// A second call before the next write replaces the first.
func (s *Server) InjectDiskError(errno syscall.Errno) { s.node.faults.errno.Store(uintptr(errno)) }
