package raftnode

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Snapshots are taken off the Ready loop. Every SnapshotterConfig.Entries applied entries (and after a
// membership change) the loop freezes the state machine, which costs a moment under the FSM lock
// whatever its size (fsm.View), and hands the view to Run, which encodes it and writes it to raft.db
// while the loop goes on ticking, sending, persisting and applying. Once it is durable the loop compacts
// the log (Taken). At a million leases the encoding is some 0.4 s and the raft.db write 46 MB; on the
// loop they stalled every node at once (all snapshot at the same index) for up to 5 s, past the election
// timeout. One snapshot is in flight at a time.
//
// Off the loop, a snapshot still takes a core and the disk for a while, and three nodes snapshotting at
// the same index slow the whole cluster at once: a commit needs a majority, and at that moment every
// member is busy. So the voters stagger their snapshot
// points over the interval (snapshotPhase): each snapshots every Entries entries, at a phase of
// its own, and at most one of three is busy with a snapshot at any index.

// Snapshotter decides on the node's snapshots on the Ready loop and writes them beside it. Maybe,
// Taken, ConfChanged and Restored run on the loop only; Run on a goroutine of its own.
type Snapshotter struct {
	cfg SnapshotterConfig
	// index is the last snapshot's index: taken here, or restored from the leader.
	index uint64
	// confDue: a conf change applied since the last snapshot. The next Ready takes one, so that the
	// snapshot raft sends a new member names it in its ConfState (raft refuses a snapshot that does not)
	// and carries the member table it joined.
	confDue bool
	// busy: a snapshot is being written. jobs and results carry it to Run and back.
	busy    bool
	jobs    chan snapshotJob
	results chan SnapshotResult
}

// SnapshotterConfig is what the Snapshotter needs of the node.
type SnapshotterConfig struct {
	Self uint64
	// Entries is the snapshot interval in applied entries; CatchUp how many entries a compaction keeps
	// behind a snapshot for slow followers.
	Entries, CatchUp uint64
	// Index is the index of the log's snapshot as the node starts.
	Index    uint64
	Storage  SnapshotStorage
	Watchdog *Watchdog
	// Applied is the state machine's applied index; ConfState raft's configuration at it.
	Applied   func() uint64
	ConfState func() *raftpb.ConfState
	// Prepare runs before the state is frozen: what must be durable before a snapshot is (the
	// HardState raft did not need synced, the audit lines of the entries it covers).
	Prepare func() error
	// Freeze returns the state machine frozen at its applied index.
	Freeze func() SnapshotView
	// Took hears of each snapshot taken and the log compacted behind it (metrics).
	Took func(index uint64, bytes int, took time.Duration)
	Log  *slog.Logger
}

// SnapshotView is the state machine frozen at an index (fsm.View).
type SnapshotView interface {
	AppliedIndex() uint64
	Encode() ([]byte, error)
	// Release lets the state machine change what the view shares with it in place again.
	Release()
}

// SnapshotStorage is the part of the raft log the snapshots are written to.
type SnapshotStorage interface {
	CreateSnapshot(i uint64, cs *raftpb.ConfState, data []byte) (*raftpb.Snapshot, error)
	Compact(compactIndex uint64) error
}

// snapshotJob is a snapshot the loop decided on: the state frozen at an index, with the ConfState at it.
type snapshotJob struct {
	view  SnapshotView
	cs    *raftpb.ConfState
	start time.Time
}

// SnapshotResult is what became of a snapshot Run wrote, for Taken.
type SnapshotResult struct {
	index uint64
	bytes int
	start time.Time
	err   error
}

// NewSnapshotter returns a Snapshotter with no snapshot in flight.
func NewSnapshotter(cfg SnapshotterConfig) *Snapshotter {
	return &Snapshotter{
		cfg:     cfg,
		index:   cfg.Index,
		jobs:    make(chan snapshotJob, 1),
		results: make(chan SnapshotResult, 1),
	}
}

// Results delivers each snapshot Run wrote, for the loop to hand to Taken.
func (s *Snapshotter) Results() <-chan SnapshotResult { return s.results }

// ConfChanged records that a conf change applied: the next Maybe takes a snapshot.
func (s *Snapshotter) ConfChanged() { s.confDue = true }

// Restored records that the state machine was replaced by a snapshot at index from the leader.
func (s *Snapshotter) Restored(index uint64) { s.index = index }

// NextAt is the applied index at which this node, whose last snapshot is at index with configuration
// cs, takes its next one.
func (s *Snapshotter) NextAt(index uint64, cs *raftpb.ConfState) uint64 {
	return nextSnapshotAt(index, s.cfg.Entries, snapshotPhase(s.cfg.Self, cs, s.cfg.Entries))
}

// Maybe starts a snapshot every Entries entries (at this node's phase), or after a conf change, unless
// one is in flight. What Prepare makes durable goes to disk first: raft refuses to restart with a commit
// index below its snapshot's.
func (s *Snapshotter) Maybe() error {
	if s.busy {
		return nil
	}
	cs := s.cfg.ConfState()
	if s.cfg.Applied() < s.NextAt(s.index, cs) && !s.confDue {
		return nil
	}
	s.confDue = false
	if err := s.cfg.Prepare(); err != nil {
		return err
	}
	view := s.cfg.Freeze()
	s.busy = true
	s.jobs <- snapshotJob{view: view, cs: cs, start: time.Now()} // room for one: never blocks
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

// Run encodes and writes the loop's snapshots, one at a time, until stop closes. A snapshot it has begun
// it finishes: a stopping node then closes its log after it.
func (s *Snapshotter) Run(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case job := <-s.jobs:
			s.results <- s.write(job) // room for one: never blocks
		}
	}
}

// write encodes job's view and makes it the log's snapshot.
func (s *Snapshotter) write(job snapshotJob) SnapshotResult {
	res := SnapshotResult{index: job.view.AppliedIndex(), start: job.start}
	data, err := job.view.Encode()
	job.view.Release() // the FSM may change leases in place again
	if err != nil {
		res.err = fmt.Errorf("encode snapshot at %d: %w", res.index, err)
		return res
	}
	res.bytes = len(data)
	res.err = s.cfg.Watchdog.SnapshotWrite("snapshot", func() error {
		_, err := s.cfg.Storage.CreateSnapshot(res.index, job.cs, data)
		return err
	})
	return res
}

// Taken runs on the loop once a snapshot is written: it compacts the log behind it, keeping CatchUp
// entries for slow followers. A snapshot overtaken by one the leader sent (restored meanwhile) is
// dropped; any other failure is fatal, like every failed log write.
func (s *Snapshotter) Taken(res SnapshotResult) error {
	s.busy = false
	if errors.Is(res.err, raft.ErrSnapOutOfDate) {
		return nil
	}
	if res.err != nil {
		return fmt.Errorf("create snapshot at %d: %w", res.index, res.err)
	}
	s.index = max(s.index, res.index)
	if catchUp := s.cfg.CatchUp; res.index > catchUp {
		err := s.cfg.Watchdog.Write("compaction", func() error { return s.cfg.Storage.Compact(res.index - catchUp) })
		if err != nil && !errors.Is(err, raft.ErrCompacted) {
			return fmt.Errorf("compact log at %d: %w", res.index-catchUp, err)
		}
	}
	took := time.Since(res.start)
	s.cfg.Took(res.index, res.bytes, took)
	s.cfg.Log.Debug("snapshot taken", "index", res.index, "bytes", res.bytes, "took", took.Seconds())
	return s.Maybe() // a conf change may have come meanwhile
}
