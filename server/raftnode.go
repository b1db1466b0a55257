package server

import (
	"context"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server/internal/raftnode"
)

// The wiring of server/internal/raftnode's parts to the node.

// newWatchdog returns the disk watchdog of n's raft log writes (decision 13): snapshots go to logPath
// (raft.db), saves and compactions to the WAL segment walPath names (nil: logPath too).
func newWatchdog(n *node, logPath string, walPath func() string) *raftnode.Watchdog {
	return raftnode.NewWatchdog(raftnode.WatchdogConfig{
		Path: func(op string) string {
			if op == "snapshot" || walPath == nil {
				return logPath
			}
			return walPath()
		},
		BeforeWrite: n.faults.beforeWrite,
		Stop:        n.stopped,
		Fatal: func() error {
			if p := n.fatalErr.Load(); p != nil {
				return *p
			}
			return nil
		},
	})
}

// watchDisk runs n's disk watchdog until stop closes or n stops. On a stalled write it stops n serving
// with the watchdog's error, while n's Ready loop may still be blocked in that write.
func watchDisk(n *node, stop <-chan struct{}) {
	n.watchdog.Watch(stop, n.done, n.cfg.DiskStallTimeout, func(err error) {
		n.fail(err)
		n.halt()
	})
}

// newSnapshotter returns n's snapshotter (raftnode.Snapshotter), whose log's snapshot is at index.
func newSnapshotter(n *node, index uint64) *raftnode.Snapshotter {
	return raftnode.NewSnapshotter(raftnode.SnapshotterConfig{
		Self: n.id, Entries: n.cfg.SnapshotEntries, CatchUp: n.cfg.SnapshotCatchUp, Index: index,
		Storage: liveStorage{n}, Watchdog: n.watchdog,
		Applied:   func() uint64 { return n.state.Applied() },
		ConfState: func() *raftpb.ConfState { return n.confState },
		Prepare: func() error {
			if err := n.flushHardState(); err != nil {
				return err
			}
			n.audit.WaitWritten() // a restart re-logs only the entries after the snapshot (auth.AuditTrail)
			return nil
		},
		Freeze: func() raftnode.SnapshotView { return n.state.View() },
		Took: func(_ uint64, bytes int, took time.Duration) {
			n.metrics.snapSeconds.Observe(took.Seconds())
			n.metrics.snapBytes.Set(float64(bytes))
			n.updateLogEntries()
		},
		Log: n.log,
	})
}

// liveStorage reaches n's raft log as it is when called (tests put a StorageFault in front of it after
// the node is made).
type liveStorage struct{ n *node }

func (s liveStorage) CreateSnapshot(i uint64, cs *raftpb.ConfState, data []byte) (*raftpb.Snapshot, error) {
	return s.n.storage.CreateSnapshot(i, cs, data)
}
func (s liveStorage) Compact(i uint64) error { return s.n.storage.Compact(i) }

// newLocalStorage returns n's local storage threads (raftnode.LocalStorage). What they call of n they
// read at each call: the raft host comes after them, and tests put a StorageFault before the log.
func newLocalStorage(n *node) *raftnode.LocalStorage[*fsm.FSM] {
	return raftnode.NewLocalStorage(raftnode.LocalStorageConfig[*fsm.FSM]{
		Persist: n.persist,
		Decode:  fsm.Restore,
		Restore: n.restoreSnapshot,
		Apply: func(ents []*raftpb.Entry) error {
			start := time.Now()
			if err := n.state.Apply(ents); err != nil {
				return err
			}
			n.audit.HandOff()
			n.metrics.applySeconds.Observe(since(start))
			return nil
		},
		Deliver: func(resps []*raftpb.Message) { n.host.deliver(resps) },
	})
}

// newLeaderLoss returns the leader-loss hint of n (raftnode.LeaderLoss).
func newLeaderLoss(n *node) *raftnode.LeaderLoss {
	return raftnode.NewLeaderLoss(raftnode.LeaderLossConfig{
		Self: n.id, Election: n.cfg.ElectionTimeout(), Raft: liveRaft{n},
		Leader: n.leader.Load, IsLeader: n.isLeader, Log: n.log,
		Forgot: func() { n.metrics.leaderStreamLost.Inc() },
	})
}

// liveRaft reaches n's raft as it is when called (n.raft is set once raft starts, after the transport
// that carries the hints; tests replace it).
type liveRaft struct{ n *node }

func (r liveRaft) ForgetLeader(ctx context.Context) error { return r.n.raft.ForgetLeader(ctx) }
func (r liveRaft) Campaign(ctx context.Context) error     { return r.n.raft.Campaign(ctx) }
func (r liveRaft) Status() raft.Status                    { return r.n.raft.Status() }
