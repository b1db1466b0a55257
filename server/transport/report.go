package transport

import (
	"sync"

	"go.etcd.io/raft/v3"
)

// reporter delivers ReportUnreachable and ReportSnapshot calls to Raft from one goroutine of its own.
// Send must never call into raft (raft's node methods block on the node's goroutine, which may be
// waiting for the very Ready loop that is calling Send), so drops are recorded here under a mutex and
// delivered asynchronously. Unreachable reports for the same peer coalesce; snapshot reports do not,
// because raft counts on one report per MsgSnap.
type reporter struct {
	raft Raft

	mu          sync.Mutex
	unreachable map[uint64]struct{}
	snapshots   []snapshotReport

	wake chan struct{} // capacity 1: a pending wake-up covers every report recorded before it is seen
	stop chan struct{} // closed by Transport.Close once no goroutine can record reports any more
	done chan struct{} // closed when run returns
}

type snapshotReport struct {
	to     uint64
	status raft.SnapshotStatus
}

func newReporter(r Raft) *reporter {
	return &reporter{
		raft:        r,
		unreachable: make(map[uint64]struct{}),
		wake:        make(chan struct{}, 1),
		stop:        make(chan struct{}),
		done:        make(chan struct{}),
	}
}

// reportUnreachable records that messages to id were lost. It never blocks.
func (r *reporter) reportUnreachable(id uint64) {
	r.mu.Lock()
	r.unreachable[id] = struct{}{}
	r.mu.Unlock()
	r.poke()
}

// reportSnapshot records the outcome of one MsgSnap to id. It never blocks.
func (r *reporter) reportSnapshot(id uint64, status raft.SnapshotStatus) {
	r.mu.Lock()
	r.snapshots = append(r.snapshots, snapshotReport{to: id, status: status})
	r.mu.Unlock()
	r.poke()
}

func (r *reporter) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// run delivers reports until stop is closed, then delivers what is left and returns, so reports
// recorded while peers shut down still reach raft.
func (r *reporter) run() {
	defer close(r.done)
	for {
		select {
		case <-r.wake:
			r.flush()
		case <-r.stop:
			r.flush()
			return
		}
	}
}

func (r *reporter) flush() {
	r.mu.Lock()
	var ids []uint64
	for id := range r.unreachable {
		ids = append(ids, id)
	}
	clear(r.unreachable)
	snaps := r.snapshots
	r.snapshots = nil
	r.mu.Unlock()

	// Outside the lock: raft may take its time, and recording must stay non-blocking meanwhile.
	for _, id := range ids {
		r.raft.ReportUnreachable(id)
	}
	for _, s := range snaps {
		r.raft.ReportSnapshot(s.to, s.status)
	}
}
