package server

import (
	"fmt"
	"sync/atomic"
	"time"
)

// The disk watchdog (decision 13, fail-stop beats limping). Every raft log write goes through diskWrite,
// which records when the write in flight started; a goroutine checks its age, and once one write has not
// returned for Config.DiskStallTimeout it stops the node: a leader whose disk stopped answering would
// otherwise linger, answering nobody, while its clients wait (the followers elect another leader after
// the election timeout, but requests sent to this node hang). It watches the age of the single write in
// flight, never throughput: a slow disk whose every write finishes in time never trips it.

// writeSlot is a raft log write in flight, for the watchdog: when it started (time.Now's monotonic
// reading as an offset from node.epoch, plus one; 0: none) and what it is. The Ready loop writes one at a
// time (node.loopWrite); the snapshotter writes a snapshot beside it (node.snapWrite).
type writeSlot struct {
	start atomic.Int64
	op    atomic.Pointer[string]
}

// diskWrite runs one raft log write (op names it in the error) on the Ready loop, visible to the watchdog.
// A write that returns after the watchdog gave up on it reports that the node stopped: nothing after it may
// act as if the node still ran.
func (n *node) diskWrite(op string, write func() error) error {
	return n.watchedWrite(&n.loopWrite, op, write)
}

// watchedWrite runs write in slot, visible to the watchdog.
func (n *node) watchedWrite(slot *writeSlot, op string, write func() error) error {
	slot.op.Store(&op)
	slot.start.Store(int64(time.Since(n.epoch)) + 1)
	err := n.faults.beforeWrite(n.stopped, func() string { return n.writePath(op) })
	if err == nil {
		err = write()
	}
	slot.start.Store(0)
	if p := n.fatalErr.Load(); err == nil && p != nil {
		err = fmt.Errorf("%w: %v", ErrStopped, *p)
	}
	return err
}

// inFlightWrite is the Ready loop's raft log write in flight and how long it has run (ok false: none).
func (n *node) inFlightWrite() (op string, age time.Duration, ok bool) {
	return n.inFlight(&n.loopWrite)
}

func (n *node) inFlight(slot *writeSlot) (op string, age time.Duration, ok bool) {
	start := slot.start.Load()
	if start == 0 {
		return "", 0, false
	}
	if p := slot.op.Load(); p != nil {
		op = *p
	}
	return op, time.Since(n.epoch) - time.Duration(start-1), true
}

// watchDisk stops the node once a raft log write (the loop's or the snapshotter's) has been in flight for
// longer than DiskStallTimeout, counting only time during which the watchdog itself ran (writeAge). It
// returns when stop closes or the node stops.
func (n *node) watchDisk(stop <-chan struct{}) {
	timeout := n.cfg.DiskStallTimeout
	period := max(timeout/8, time.Millisecond)
	ticker := time.NewTicker(period)
	defer ticker.Stop()
	slots := []*writeSlot{&n.loopWrite, &n.snapWrite}
	ages := []writeAge{{period: period, last: time.Now()}, {period: period, last: time.Now()}}
	for {
		select {
		case <-stop:
			return
		case <-n.done:
			return
		case now := <-ticker.C:
			for i, slot := range slots {
				op, age, ok := n.inFlight(slot)
				if counted := ages[i].observe(now, slot.start.Load(), age, ok); counted > timeout {
					n.fail(fmt.Errorf("raft log %s to %s has not returned for %v (disk stall timeout %v): %w",
						op, n.writePath(op), counted.Round(time.Millisecond), timeout, ErrDiskStalled))
					n.halt()
					return
				}
			}
		}
	}
}

// writeAge is the age of the write in flight as the watchdog counts it: the time between two of its
// ticks counts for at most two tick periods. A longer gap means the watchdog did not run — the whole
// process was stopped (SIGSTOP, a paused VM) or starved — and that is not the disk's doing: a node frozen
// for 12 s mid-write used to stop itself the moment it woke, its write "11 s old", although the disk had
// never stalled. A disk that stalls leaves the watchdog running, so its writes age at full speed.
type writeAge struct {
	period time.Duration
	last   time.Time // the previous tick
	write  int64     // writeStart of the write being timed; 0: none
	age    time.Duration
}

// observe records a tick at now, with the write in flight (start, its age on the node's clock; ok false:
// none), and returns the write's counted age.
func (w *writeAge) observe(now time.Time, start int64, age time.Duration, ok bool) time.Duration {
	awake := min(now.Sub(w.last), 2*w.period)
	w.last = now
	switch {
	case !ok || start == 0:
		w.write, w.age = 0, 0
	case start != w.write: // a new write: it began at most one tick ago, as far as the watchdog knows
		w.write, w.age = start, min(age, awake)
	default:
		w.age += awake
	}
	return w.age
}

// writePath names the file a raft log write of kind op is writing: raft.db for a snapshot, the WAL
// segment for a save or a compaction (a save carrying a snapshot writes both; the WAL first).
func (n *node) writePath(op string) string {
	if op == "snapshot" || n.walPath == nil {
		return n.logPath
	}
	return n.walPath()
}
