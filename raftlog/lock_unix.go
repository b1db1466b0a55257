//go:build unix

package raftlog

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
)

// lockRetry is how often a contended lock is retried. flock has no timed
// wait, so polling is the only bounded way to wait for it.
const lockRetry = 10 * time.Millisecond

// lockFile takes an flock on f, waiting at most timeout. bbolt later locks
// the same open file again, which flock treats as a no-op, so the lock taken
// here covers both the structure check and bbolt's own reads.
func lockFile(f *os.File, exclusive bool, timeout time.Duration) error {
	how := syscall.LOCK_SH
	if exclusive {
		how = syscall.LOCK_EX
	}
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return fmt.Errorf("flock: %w", err)
		}
		if time.Now().After(deadline) {
			return ErrLocked
		}
		time.Sleep(lockRetry)
	}
}
