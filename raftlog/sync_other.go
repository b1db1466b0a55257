//go:build !linux

package raftlog

import "os"

// fdatasync falls back to a full fsync where fdatasync(2) is not available.
func fdatasync(f *os.File) error { return f.Sync() }
