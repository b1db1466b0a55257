//go:build !unix

package raftlog

import (
	"os"
	"time"
)

// lockFile is a no-op where flock does not exist; bbolt still takes its own
// lock (with the same timeout) right after the structure check.
func lockFile(f *os.File, exclusive bool, timeout time.Duration) error { return nil }
