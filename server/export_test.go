package server

import (
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server/internal/rpc"
)

// Test hooks for the external test package (server_test).

// QueueLen is the number of blocking acquires queued for resource on this node.
func (s *Server) QueueLen(resource string) int { return s.node.queue.Waiting(resource) }

// Ticks is how many times the node's Ready loop has ticked.
func (s *Server) Ticks() uint64 { return s.node.raft.Ticks() }

// SnapshotsRestored is how many snapshots this node received from a leader and restored.
func (s *Server) SnapshotsRestored() uint64 { return s.node.raft.Restores() }

// LiveViews is how many views of this node's state machine are taken and not yet released.
func (s *Server) LiveViews() (n int) {
	s.node.state.Read(func(sm *fsm.FSM) { n = sm.LiveViews() })
	return n
}

// CheckpointedAmong is how many of resources hold a lease this node's state machine has applied an idle
// checkpoint to.
func (s *Server) CheckpointedAmong(resources []string) (n int) {
	s.node.state.Read(func(sm *fsm.FSM) {
		for _, r := range resources {
			if l, ok := sm.Get(r); ok && l.Checkpointed && !l.Renewed {
				n++
			}
		}
	})
	return n
}

// LogFirstIndex is the first index left in the node's raft log: those before it were compacted away.
func (s *Server) LogFirstIndex() uint64 {
	first, _ := s.node.logIndex.FirstIndex()
	return first
}

// LogLastIndex is the last index in the node's raft log.
func (s *Server) LogLastIndex() uint64 {
	last, _ := s.node.logIndex.LastIndex()
	return last
}

// StorageFault makes a node's raft-log writes fail on demand, like a full or failing disk, or holds its
// snapshot writes, like a disk slow to take a large one.
type StorageFault struct {
	logStore
	err atomic.Pointer[error]
	// hold, when set, is closed to let held snapshot writes go on; held receives one value per snapshot
	// write that starts waiting.
	hold        atomic.Pointer[chan struct{}]
	held        chan struct{}
	holdSaves   atomic.Pointer[chan struct{}]
	compactions atomic.Int64
	// mu is held by a held save, as raftlog holds its lock across a write and its fsync: Size waits.
	mu sync.RWMutex
}

// HoldSaves makes the next raft log saves wait until release is called, like a disk that stopped
// answering: the node's Ready loop blocks in the first, and Size waits for it as raftlog's would.
func (f *StorageFault) HoldSaves() (release func()) {
	hold := make(chan struct{})
	f.holdSaves.Store(&hold)
	return sync.OnceFunc(func() { close(hold); f.holdSaves.Store(nil) })
}

// HoldSnapshots makes snapshot writes wait until release is called; started receives one value as each
// begins to wait.
func (f *StorageFault) HoldSnapshots() (started <-chan struct{}, release func()) {
	hold := make(chan struct{})
	f.held = make(chan struct{}, 16)
	f.hold.Store(&hold)
	return f.held, func() { close(hold) }
}

// Compactions is how many log compactions succeeded.
func (f *StorageFault) Compactions() int64 { return f.compactions.Load() }

func (f *StorageFault) Compact(i uint64) error {
	err := f.logStore.Compact(i)
	if err == nil {
		f.compactions.Add(1)
	}
	return err
}

// Fail makes every later write return err.
func (f *StorageFault) Fail(err error) { f.err.Store(&err) }

func (f *StorageFault) Save(hs *raftpb.HardState, ents []*raftpb.Entry, snap *raftpb.Snapshot) error {
	if p := f.err.Load(); p != nil {
		return *p
	}
	if hold := f.holdSaves.Load(); hold != nil {
		f.mu.Lock()
		defer f.mu.Unlock()
		<-*hold
	}
	return f.logStore.Save(hs, ents, snap)
}

// Size waits for a held save, as raftlog's does for a write in flight.
func (f *StorageFault) Size() int64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.logStore.Size()
}

func (f *StorageFault) CreateSnapshot(i uint64, cs *raftpb.ConfState, data []byte) (*raftpb.Snapshot, error) {
	if p := f.err.Load(); p != nil {
		return nil, *p
	}
	if hold := f.hold.Load(); hold != nil {
		f.held <- struct{}{}
		<-*hold
	}
	return f.logStore.CreateSnapshot(i, cs, data)
}

// NewWithStorageFault is New with a StorageFault between the node and its raft log (before Start).
func NewWithStorageFault(cfg Config, lis Listeners) (*Server, *StorageFault, error) {
	s, err := New(cfg, lis)
	if err != nil {
		return nil, nil, err
	}
	f := &StorageFault{logStore: s.node.storage}
	s.node.storage = f
	return s, f, nil
}

// Waiters is how many blocking acquires this node queues.
func (s *Server) Waiters() int { return s.node.queue.Len() }

// PublishEvents hands events to this node's watchers as if an entry at index had applied them.
func (s *Server) PublishEvents(index uint64, events []fsm.Event) { s.node.watch.Publish(index, events) }

// AcceptsPeer reports whether this node takes raft messages from id (its member check).
func (s *Server) AcceptsPeer(id uint64) bool { return s.node.members.IsMember(id) }

// SetSnapshotStall sets how long a Snapshot stream may take no chunk; the returned func restores it.
func SetSnapshotStall(d time.Duration) (restore func()) {
	return rpc.SetSnapshotStall(d)
}

// OnHandoffProposing makes fn run after a release claimed the head waiter of its resource and before it
// proposes the entry carrying that waiter's grant; nil removes it.
func (s *Server) OnHandoffProposing(fn func()) { s.node.hooks.handoffProposing.Store(&fn) }
