package server

import (
	"errors"
	"fmt"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/leased/leased/fsm"
)

// Snapshots are taken off the Ready loop. Every SnapshotEntries applied entries (and after a membership
// change) the loop freezes the state machine, which costs a moment under the FSM lock whatever its size
// (fsm.View), and hands the view to snapshotLoop, which encodes it and writes it to raft.db while the
// loop goes on ticking, sending, persisting and applying. Once it is durable the loop compacts the log
// (snapshotTaken). At a million leases the encoding is some 0.4 s and the raft.db write 46 MB; on the loop
// they stalled every node at once (all snapshot at the same index) for up to 5 s, past the election
// timeout. One snapshot is in flight at a time.
//
// Off the loop, a snapshot still takes a core and the disk for a while, and three nodes snapshotting at
// the same index slow the whole cluster at once: a commit needs a majority, and at that moment every
// member is busy. So the voters stagger their snapshot
// points over the interval (snapshotPhase): each snapshots every SnapshotEntries entries, at a phase of
// its own, and at most one of three is busy with a snapshot at any index.

// snapshotJob is a snapshot the loop decided on: the state frozen at index, with the ConfState at it.
type snapshotJob struct {
	view  *fsm.View
	cs    *raftpb.ConfState
	start time.Time
}

// snapshotResult is what became of a snapshotJob.
type snapshotResult struct {
	index uint64
	bytes int
	start time.Time
	err   error
}

// maybeSnapshot starts a snapshot every SnapshotEntries entries (at this node's phase), or after a conf
// change, unless one is in flight. The HardState held back goes to disk first: raft refuses to restart
// with a commit index below its snapshot's.
func (n *node) maybeSnapshot() error {
	if n.snapshotting {
		return nil
	}
	due := nextSnapshotAt(n.snapIndex, n.cfg.SnapshotEntries, snapshotPhase(n.id, n.confState, n.cfg.SnapshotEntries))
	if n.state.Applied() < due && !n.confSnapshotDue {
		return nil
	}
	n.confSnapshotDue = false
	if err := n.flushHardState(); err != nil {
		return err
	}
	n.audit.waitWritten() // a restart re-logs only the entries after the snapshot (audit.go)
	view := n.state.View()
	n.snapshotting = true
	n.snapJobs <- snapshotJob{view: view, cs: n.confState, start: time.Now()} // room for one: never blocks
	return nil
}

// nextSnapshotAt is the applied index at which a node whose last snapshot is at snapIndex takes its next
// one: the first index at least half an interval past snapIndex that lies at phase (mod entries). Once a
// node snapshots at its phase it does so every entries entries; the first snapshot after a start or after
// a snapshot from the leader (at another phase) comes between half an interval and one and a half later.
func nextSnapshotAt(snapIndex, entries, phase uint64) uint64 {
	from := snapIndex + max(entries/2, 1)
	return from + (phase%entries+entries-from%entries)%entries
}

// snapshotPhase spreads the voters' snapshot points evenly over the interval, by the node's rank among
// the voters' IDs (the same on every node: the ConfState is replicated). A learner or a lone node takes
// phase 0.
func snapshotPhase(id uint64, cs *raftpb.ConfState, entries uint64) uint64 {
	voters := cs.GetVoters()
	rank := uint64(0)
	found := false
	for _, v := range voters {
		if v < id {
			rank++
		}
		found = found || v == id
	}
	if !found {
		return 0
	}
	return entries / uint64(len(voters)) * rank
}

// snapshotLoop encodes and writes the loop's snapshots, one at a time, until stop closes. A snapshot it
// has begun it finishes: a stopping node then closes its log after it.
func (n *node) snapshotLoop(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case job := <-n.snapJobs:
			n.snapResults <- n.writeSnapshot(job) // room for one: never blocks
		}
	}
}

// writeSnapshot encodes job's view and makes it the log's snapshot.
func (n *node) writeSnapshot(job snapshotJob) snapshotResult {
	res := snapshotResult{index: job.view.AppliedIndex(), start: job.start}
	data, err := job.view.Encode()
	job.view.Release() // the FSM may change leases in place again
	if err != nil {
		res.err = fmt.Errorf("encode snapshot at %d: %w", res.index, err)
		return res
	}
	res.bytes = len(data)
	res.err = n.watchdog.SnapshotWrite("snapshot", func() error {
		_, err := n.storage.CreateSnapshot(res.index, job.cs, data)
		return err
	})
	return res
}

// snapshotTaken runs on the loop once a snapshot is written: it compacts the log behind it, keeping
// SnapshotCatchUp entries for slow followers. A snapshot overtaken by one the leader sent (restored
// meanwhile) is dropped; any other failure is fatal, like every failed log write.
func (n *node) snapshotTaken(res snapshotResult) error {
	n.snapshotting = false
	if errors.Is(res.err, raft.ErrSnapOutOfDate) {
		return nil
	}
	if res.err != nil {
		return fmt.Errorf("create snapshot at %d: %w", res.index, res.err)
	}
	n.snapIndex = max(n.snapIndex, res.index)
	if res.index > n.cfg.SnapshotCatchUp {
		err := n.watchdog.Write("compaction", func() error { return n.storage.Compact(res.index - n.cfg.SnapshotCatchUp) })
		if err != nil && !errors.Is(err, raft.ErrCompacted) {
			return fmt.Errorf("compact log at %d: %w", res.index-n.cfg.SnapshotCatchUp, err)
		}
	}
	n.metrics.snapSeconds.Observe(since(res.start))
	n.metrics.snapBytes.Set(float64(res.bytes))
	n.updateLogEntries()
	n.log.Debug("snapshot taken", "index", res.index, "bytes", res.bytes, "took", since(res.start))
	return n.maybeSnapshot() // a conf change may have come meanwhile
}
