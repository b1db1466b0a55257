package server

import (
	"fmt"
	"time"
)

// The disk watchdog (decision 13, fail-stop beats limping). Every raft log write goes through diskWrite,
// which records when the write in flight started; a goroutine checks its age, and once one write has not
// returned for Config.DiskStallTimeout it stops the node: a leader whose disk stopped answering would
// otherwise linger, answering nobody, while its clients wait (the followers elect another leader after
// the election timeout, but requests sent to this node hang). It watches the age of the single write in
// flight, never throughput: a slow disk whose every write finishes in time never trips it.

// diskWrite runs one raft log write (op names it in the error) on the Ready loop, visible to the watchdog.
// A write that returns after the watchdog gave up on it reports that the node stopped: nothing after it may
// act as if the node still ran.
func (n *node) diskWrite(op string, write func() error) error {
	n.writeOp.Store(&op)
	n.writeStart.Store(int64(time.Since(n.epoch)) + 1)
	n.faults.beforeWrite(n.stopped)
	err := write()
	n.writeStart.Store(0)
	if p := n.fatalErr.Load(); err == nil && p != nil {
		err = fmt.Errorf("%w: %v", ErrStopped, *p)
	}
	return err
}

// inFlightWrite is the raft log write in flight and how long it has run (ok false: none).
func (n *node) inFlightWrite() (op string, age time.Duration, ok bool) {
	start := n.writeStart.Load()
	if start == 0 {
		return "", 0, false
	}
	if p := n.writeOp.Load(); p != nil {
		op = *p
	}
	return op, time.Since(n.epoch) - time.Duration(start-1), true
}

// watchDisk stops the node once a raft log write has been in flight for longer than DiskStallTimeout.
// It returns when stop closes or the node stops.
func (n *node) watchDisk(stop <-chan struct{}) {
	timeout := n.cfg.DiskStallTimeout
	ticker := time.NewTicker(max(timeout/8, time.Millisecond))
	defer ticker.Stop()
	for {
		select {
		case <-stop:
			return
		case <-n.done:
			return
		case <-ticker.C:
		}
		if op, age, ok := n.inFlightWrite(); ok && age > timeout {
			n.fail(fmt.Errorf("raft log %s to %s has not returned for %v (disk stall timeout %v): %w",
				op, n.logPath, age.Round(time.Millisecond), timeout, ErrDiskStalled))
			n.halt()
			return
		}
	}
}
