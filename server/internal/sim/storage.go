package sim

import (
	"sync"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Storage is a node's raft log in memory: raft reads it as a raft.MemoryStorage, the node writes it
// through Save, CreateSnapshot and Compact. What Save returned from is "durable": a node restarted on
// the same Storage finds it, as after a crash. Safe for concurrent use.
type Storage struct {
	*raft.MemoryStorage

	mu      sync.Mutex
	stall   time.Duration // the next Save blocks this long first
	latency time.Duration // every Save takes this long
	saves   int
}

// NewStorage returns an empty log.
func NewStorage() *Storage { return &Storage{MemoryStorage: raft.NewMemoryStorage()} }

// Stall makes the next Save block for d before writing, like a disk that stops answering.
func (s *Storage) Stall(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stall = d
}

// Slow makes every Save take d, like a slow disk that still makes progress (0: fast again).
func (s *Storage) Slow(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.latency = d
}

// Saves is how many Saves completed.
func (s *Storage) Saves() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.saves
}

// Save persists a snapshot, then the HardState and entries (replacing any suffix they conflict with).
func (s *Storage) Save(hs *raftpb.HardState, ents []*raftpb.Entry, snap *raftpb.Snapshot) error {
	s.mu.Lock()
	d := s.stall + s.latency
	s.stall = 0
	s.mu.Unlock()
	if d > 0 {
		time.Sleep(d)
	}
	if snap != nil && !raft.IsEmptySnap(snap) {
		if err := s.ApplySnapshot(snap); err != nil && err != raft.ErrSnapOutOfDate {
			return err
		}
	}
	if hs != nil && !raft.IsEmptyHardState(hs) {
		if err := s.SetHardState(hs); err != nil {
			return err
		}
	}
	if err := s.Append(ents); err != nil {
		return err
	}
	s.mu.Lock()
	s.saves++
	s.mu.Unlock()
	return nil
}

// Size is the log's approximate size: the entries kept, in bytes of payload.
func (s *Storage) Size() int64 {
	first, _ := s.FirstIndex()
	last, _ := s.LastIndex()
	if last < first {
		return 0
	}
	ents, err := s.Entries(first, last+1, 1<<62)
	if err != nil {
		return 0
	}
	var n int64
	for _, e := range ents {
		n += int64(len(e.GetData()))
	}
	return n
}

// Close does nothing: the contents stay for a node restarted on the same Storage.
func (s *Storage) Close() error { return nil }
