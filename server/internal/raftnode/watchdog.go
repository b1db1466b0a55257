// Package raftnode is the node's Ready loop over raft's RawNode (Node), apart from the lease service,
// which it never imports (tests/deps). It takes proposals (Waiter matches them to their outcomes), serves
// batched ReadIndex rounds, checks peer messages before raft sees them (CheckPeerMessage), persists,
// sends, and hands committed entries and the leader's snapshots to the Applier the layer above
// registers, telling it of leadership and ticks through a Handler, as etcd's raftNode does through its
// raftReadyHandler. Its parts: the disk watchdog that every raft log write goes through (Watchdog), the
// hint that a crashed leader's broken stream gives its followers to elect another at once (LeaderLoss),
// the bound on the terms peers may send (TermGuard), the commit notices held back for the next append
// (CommitNotices), raft's local storage threads played on the loop (LocalStorage), the snapshots taken
// beside it (Snapshotter), and raft's logger (NewRaftLogger).
package raftnode

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/leased/leased/server/internal/errs"
)

// The disk watchdog (decision 13, fail-stop beats limping). Every raft log write goes through Write (or
// SnapshotWrite), which records when the write in flight started; a goroutine (Watch) checks its age, and
// once one write has not returned for the disk stall timeout it stops the node: a leader whose disk
// stopped answering would otherwise linger, answering nobody, while its clients wait (the followers elect
// another leader after the election timeout, but requests sent to this node hang). It watches the age of
// the single write in flight, never throughput: a slow disk whose every write finishes in time never
// trips it.

// Watchdog times the raft log writes in flight: the Ready loop's, one at a time, and the snapshotter's
// beside it.
type Watchdog struct {
	// epoch is the origin of the writes' start times.
	epoch time.Time
	loop  writeSlot
	snap  writeSlot
	cfg   WatchdogConfig
}

// WatchdogConfig is what the watchdog needs of the node.
type WatchdogConfig struct {
	// Path names the file a write of kind op is writing, for errors.
	Path func(op string) string
	// BeforeWrite runs before every write (injected disk faults; nil: none); it may block until stop
	// closes, and an error it returns is the write's, which is then not made.
	BeforeWrite func(stop <-chan struct{}, path func() string) error
	// Stop closes when the node stops (BeforeWrite's stop).
	Stop <-chan struct{}
	// Fatal is the error that stopped the node, nil while it runs.
	Fatal func() error
}

// NewWatchdog returns a watchdog with no write in flight.
func NewWatchdog(cfg WatchdogConfig) *Watchdog {
	return &Watchdog{epoch: time.Now(), cfg: cfg}
}

// writeSlot is a raft log write in flight, for the watchdog: when it started (time.Now's monotonic
// reading as an offset from Watchdog.epoch, plus one; 0: none) and what it is.
type writeSlot struct {
	start atomic.Int64
	op    atomic.Pointer[string]
}

// Write runs one raft log write (op names it in the error) on the Ready loop, visible to the watchdog.
// A write that returns after the node stopped (the watchdog gave up on it) reports that the node
// stopped: nothing after it may act as if the node still ran.
func (d *Watchdog) Write(op string, write func() error) error {
	return d.watched(&d.loop, op, write)
}

// SnapshotWrite is Write for the snapshotter's writes, which run beside the loop's.
func (d *Watchdog) SnapshotWrite(op string, write func() error) error {
	return d.watched(&d.snap, op, write)
}

// watched runs write in slot, visible to the watchdog.
func (d *Watchdog) watched(slot *writeSlot, op string, write func() error) error {
	slot.op.Store(&op)
	slot.start.Store(int64(time.Since(d.epoch)) + 1)
	var err error
	if d.cfg.BeforeWrite != nil {
		err = d.cfg.BeforeWrite(d.cfg.Stop, func() string { return d.cfg.Path(op) })
	}
	if err == nil {
		err = write()
	}
	slot.start.Store(0)
	if fatal := d.cfg.Fatal(); err == nil && fatal != nil {
		err = fmt.Errorf("%w: %v", errs.ErrStopped, fatal)
	}
	return err
}

// InFlight is the Ready loop's raft log write in flight and how long it has run (ok false: none).
func (d *Watchdog) InFlight() (op string, age time.Duration, ok bool) {
	return d.inFlight(&d.loop)
}

func (d *Watchdog) inFlight(slot *writeSlot) (op string, age time.Duration, ok bool) {
	start := slot.start.Load()
	if start == 0 {
		return "", 0, false
	}
	if p := slot.op.Load(); p != nil {
		op = *p
	}
	return op, time.Since(d.epoch) - time.Duration(start-1), true
}

// Watch calls stopNode, once, when a raft log write (the loop's or the snapshotter's) has been in flight
// for longer than timeout, counting only time during which the watchdog itself ran (writeAge). It returns
// then, or when stop or done closes.
func (d *Watchdog) Watch(stop, done <-chan struct{}, timeout time.Duration, stopNode func(error)) {
	period := max(timeout/8, time.Millisecond)
	ticker := time.NewTicker(period)
	defer ticker.Stop()
	slots := []*writeSlot{&d.loop, &d.snap}
	ages := []writeAge{{period: period, last: time.Now()}, {period: period, last: time.Now()}}
	for {
		select {
		case <-stop:
			return
		case <-done:
			return
		case now := <-ticker.C:
			for i, slot := range slots {
				op, age, ok := d.inFlight(slot)
				if counted := ages[i].observe(now, slot.start.Load(), age, ok); counted > timeout {
					stopNode(fmt.Errorf("raft log %s to %s has not returned for %v (disk stall timeout %v): %w",
						op, d.cfg.Path(op), counted.Round(time.Millisecond), timeout, errs.ErrDiskStalled))
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
