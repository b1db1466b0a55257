package server

import (
	"context"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server/internal/raftnode"
)

// The wiring of the Ready loop (internal/raftnode) to the node: the loop hands committed entries and the
// leader's snapshots to the lease state (applier), and tells the lessor, the blocking acquires and the
// initial ACL of leadership and ticks (handler).

// newRaft returns n's Ready loop on its raft log, whose snapshot is snap (raftnode.Node; its raft starts
// once the transport exists).
func newRaft(n *node, storage raft.Storage, snap *raftpb.Snapshot, logPath string, walPath func() string) *raftnode.Node {
	cfg := n.cfg
	return raftnode.New(raftnode.Config{
		ID: n.id, TickInterval: cfg.TickInterval, ElectionTicks: cfg.ElectionTicks, HeartbeatTicks: cfg.HeartbeatTicks,
		ProposalTimeout: cfg.ProposalTimeout, DiskStallTimeout: cfg.DiskStallTimeout,
		SnapshotEntries: cfg.SnapshotEntries, SnapshotCatchUp: cfg.SnapshotCatchUp,
		Clock: n.clock, Log: n.log, Storage: storage, Writer: liveStorage{n}, Snapshot: snap,
		// Snapshots go to logPath (raft.db), saves and compactions to the WAL segment walPath names (nil:
		// logPath too).
		DiskPath: func(op string) string {
			if op == "snapshot" || walPath == nil {
				return logPath
			}
			return walPath()
		},
		BeforeWrite:   n.faults.beforeWrite,
		Applier:       applier{n},
		Handler:       raftHandler(n),
		Proposers:     n.proposals,
		Send:          func(msgs []*raftpb.Message) { n.transport.Send(msgs) },
		IsMember:      n.members.IsMember,
		CheckSnapshot: checkSnapshotData,
		Dropped:       func(reason string, count int) { n.metrics.peerRejected(reason, count) },
		Registerer:    cfg.Registerer,
	})
}

// raftHandler is what n's parts above raft do as its leadership changes and its loop ticks.
func raftHandler(n *node) raftnode.Handler {
	return raftnode.Handler{
		Tick: func(now time.Time, stalled time.Duration) {
			if stalled > 0 {
				// The loop could not run: clients are not punished for the server's stall (decision 3).
				n.log.Warn("ready loop stalled; extending lease deadlines", "stall", stalled)
				n.lessor.Extend(stalled)
			}
			n.lessor.Tick(now)
		},
		BecameLeader: func(term uint64) {
			n.lessor.Promote(n.clock.Now(), term)
			n.proposeInitialACL()
		},
		LostLeadership: func() {
			n.lessor.Demote()
			n.queue.FailAll(ErrNotLeader)
		},
		Stopped: n.audit.Close,
	}
}

// applier hands the Ready loop's committed entries and snapshots to n's state (raftnode.Applier).
type applier struct{ n *node }

func (a applier) Apply(ents []*raftpb.Entry) error {
	if err := a.n.state.Apply(ents); err != nil {
		return err
	}
	a.n.audit.HandOff()
	return nil
}

func (a applier) Decode(data []byte) (raftnode.Restore, error) {
	sm, err := fsm.Restore(data)
	if err != nil {
		return nil, err
	}
	return func(snap *raftpb.Snapshot) error { return a.restore(snap, sm) }, nil
}

func (a applier) Applied() uint64 { return a.n.state.Applied() }

func (a applier) WaitApplied(ctx context.Context, index uint64, stopped <-chan struct{}) error {
	return a.n.state.WaitApplied(ctx, index, stopped)
}

func (a applier) Freeze() raftnode.SnapshotView {
	a.n.audit.WaitWritten() // a restart re-logs only the entries after the snapshot (auth.AuditTrail)
	return a.n.state.View()
}

// restore replaces the state machine with sm, decoded from a snapshot received from the leader.
func (a applier) restore(snap *raftpb.Snapshot, sm *fsm.FSM) error {
	n := a.n
	sm.SetClusterID(n.clusterID)
	n.state.Replace(sm)
	n.members.SyncPeers() // the member table came with the snapshot
	if sm.WasRemoved(n.id) {
		return n.members.Removed(snap.GetMetadata().GetIndex())
	}
	index := snap.GetMetadata().GetIndex()
	n.state.Restored(index)
	n.log.Info("restored snapshot", "index", index, "leases", sm.Len())
	return nil
}

// liveStorage reaches n's raft log as it is when called (tests put a StorageFault in front of it after
// the node is made).
type liveStorage struct{ n *node }

func (s liveStorage) Save(hs *raftpb.HardState, ents []*raftpb.Entry, snap *raftpb.Snapshot) error {
	return s.n.storage.Save(hs, ents, snap)
}

func (s liveStorage) CreateSnapshot(i uint64, cs *raftpb.ConfState, data []byte) (*raftpb.Snapshot, error) {
	return s.n.storage.CreateSnapshot(i, cs, data)
}
func (s liveStorage) Compact(i uint64) error { return s.n.storage.Compact(i) }
