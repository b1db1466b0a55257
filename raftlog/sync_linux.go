//go:build linux

package raftlog

import (
	"os"
	"syscall"
)

// fdatasync flushes f's data and only the metadata needed to read it back;
// segments are preallocated, so that is no metadata at all on most writes.
func fdatasync(f *os.File) error {
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if err != syscall.EINTR {
			return err
		}
	}
}
