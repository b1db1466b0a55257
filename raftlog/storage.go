package raftlog

import (
	"errors"
	"fmt"
	"sync"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Storage is a raft log kept in a write-ahead log (entries, HardState)
// beside a bbolt file (identity, snapshot). It implements raft.Storage and
// adds the write side (Save, Compact, CreateSnapshot, ApplySnapshot).
//
// It is safe for concurrent use. Writers are serialised with each other and
// with readers; Term, FirstIndex, LastIndex and InitialState answer from
// memory, while Entries and Snapshot read the files. CreateSnapshot is the
// exception: it writes its data to raft.db without holding up the appends
// (see there).
type Storage struct {
	path string

	// snapMu serialises the writers of raft.db's snapshot (CreateSnapshot,
	// and Save and ApplySnapshot with a snapshot) and Close. It is taken
	// before mu.
	snapMu sync.Mutex
	mu     sync.RWMutex // guards db, wal and st; held for the whole of a write but CreateSnapshot's
	db     *bolt.DB     // nil once closed
	wal    *wal
	st     state
	ack    *ackFile // the amnesia guard's mark (guard.go)
}

var _ raft.Storage = (*Storage)(nil)

// Path returns the data file's path, for logs and status pages.
func (s *Storage) Path() string { return s.path }

// InitialState implements raft.Storage. The HardState is nil until Save has
// stored a non-empty one; the ConfState is the latest snapshot's.
func (s *Storage) InitialState() (*raftpb.HardState, *raftpb.ConfState, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.db == nil {
		return nil, nil, s.closedErr("initial state")
	}
	var hs *raftpb.HardState
	if s.st.hs != nil {
		hs = proto.Clone(s.st.hs).(*raftpb.HardState)
	}
	cs := proto.Clone(raftpb.EnsureSnapshotMetadata(proto.Clone(s.st.snap).(*raftpb.SnapshotMetadata)).GetConfState())
	return hs, cs.(*raftpb.ConfState), nil
}

// Entries implements raft.Storage: the entries [lo, hi), at least one and
// then as many as fit in maxSize bytes (proto size, as MemoryStorage counts
// them). It returns raft.ErrCompacted if lo <= the offset and
// raft.ErrUnavailable if only the dummy entry is left; these two come
// unwrapped because raft compares them with ==. hi past LastIndex()+1, which
// raft never asks for, is an error wrapping raft.ErrUnavailable.
func (s *Storage) Entries(lo, hi, maxSize uint64) ([]*raftpb.Entry, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.db == nil {
		return nil, s.closedErr("entries")
	}
	if lo <= s.st.offset() {
		return nil, raft.ErrCompacted
	}
	if hi > s.st.last+1 {
		return nil, fmt.Errorf("raftlog: entries [%d, %d) beyond last index %d: %w", lo, hi, s.st.last, raft.ErrUnavailable)
	}
	if s.st.last == s.st.offset() {
		return nil, raft.ErrUnavailable
	}
	if lo > hi {
		return nil, fmt.Errorf("raftlog: entries [%d, %d): %w", lo, hi, ErrOutOfRange)
	}
	if ents, ok := s.st.cached(lo, hi, maxSize); ok {
		return ents, nil
	}
	ents, err := s.readRange(lo, hi, maxSize)
	if err != nil {
		return nil, fmt.Errorf("raftlog: entries [%d, %d): %w", lo, hi, err)
	}
	return ents, nil
}

// readRange reads [lo, hi) from the WAL, stopping before the entry that
// would push the total past maxSize, but always returning the first.
// Entries next to each other in a segment are read with one pread.
func (s *Storage) readRange(lo, hi, maxSize uint64) ([]*raftpb.Entry, error) {
	ents := make([]*raftpb.Entry, 0, min(hi-lo, 1024))
	var size uint64
	pos := s.st.pos[lo-s.st.firstIndex() : hi-s.st.firstIndex()]
	for len(pos) > 0 {
		n := readSpan(pos, min(maxReadSpan, maxSize-min(size, maxSize)))
		got, err := s.wal.readEntries(pos[:n], lo+uint64(len(ents)))
		if err != nil {
			return nil, err
		}
		for _, e := range got {
			size += uint64(proto.Size(e))
			if len(ents) > 0 && size > maxSize {
				return ents, nil
			}
			ents = append(ents, e)
		}
		pos = pos[n:]
	}
	return ents, nil
}

// maxReadSpan bounds one pread of Entries.
const maxReadSpan = 1 << 20

// readSpan returns how many of pos, at least one, lie in one segment, in
// file order, within budget bytes of the first (which keeps a small
// maxSize from reading far more than it returns).
func readSpan(pos []entryPos, budget uint64) int {
	n := 1
	for n < len(pos) && pos[n].seq == pos[0].seq && pos[n].off > pos[0].off &&
		uint64(pos[n].off+pos[n].n-pos[0].off) <= budget {
		n++
	}
	return n
}

// Term implements raft.Storage from memory: the term of entry i, for i in
// [FirstIndex()-1, LastIndex()]; bare raft.ErrCompacted below that range and
// raft.ErrUnavailable above it.
func (s *Storage) Term(i uint64) (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.db == nil {
		return 0, s.closedErr("term")
	}
	if i < s.st.offset() {
		return 0, raft.ErrCompacted
	}
	if i > s.st.last {
		return 0, raft.ErrUnavailable
	}
	return s.st.terms.term(i), nil
}

// LastIndex implements raft.Storage from memory.
func (s *Storage) LastIndex() (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.db == nil {
		return 0, s.closedErr("last index")
	}
	return s.st.last, nil
}

// FirstIndex implements raft.Storage from memory: one past the offset (the
// last compacted or snapshotted index).
func (s *Storage) FirstIndex() (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.db == nil {
		return 0, s.closedErr("first index")
	}
	return s.st.firstIndex(), nil
}

// Snapshot implements raft.Storage: the latest snapshot, metadata and data
// read from raft.db in one transaction (so they match even while a
// CreateSnapshot is writing), without holding up the log's writers. It
// never returns raft.ErrSnapshotTemporarilyUnavailable.
func (s *Storage) Snapshot() (*raftpb.Snapshot, error) {
	s.mu.RLock()
	db := s.db
	s.mu.RUnlock()
	if db == nil {
		return nil, s.closedErr("snapshot")
	}
	md := &raftpb.SnapshotMetadata{}
	var data []byte
	err := guard(s.path, func() error {
		return db.View(func(tx *bolt.Tx) error {
			if err := getProto(tx.Bucket(bucketMeta), keySnapMeta, md); err != nil {
				return fmt.Errorf("%w: snapshot metadata: %v", ErrCorrupt, err)
			}
			v := tx.Bucket(bucketSnapshot).Get(keySnapData)
			if v == nil {
				return nil
			}
			body, err := unseal(v)
			if err != nil {
				return fmt.Errorf("%w: snapshot data: %v", ErrCorrupt, err)
			}
			data = cloneBytes(body)
			return nil
		})
	})
	if errors.Is(err, bolt.ErrDatabaseNotOpen) {
		return nil, s.closedErr("snapshot")
	}
	if err != nil {
		return nil, fmt.Errorf("raftlog: snapshot: %w", err)
	}
	return raftpb.EnsureSnapshot(&raftpb.Snapshot{Metadata: md, Data: data}), nil
}

// Size returns the bytes the log occupies on disk, raft.db plus the WAL
// segments (preallocated space included), or 0 once closed.
func (s *Storage) Size() int64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.db == nil {
		return 0
	}
	var n int64
	_ = s.db.View(func(tx *bolt.Tx) error { n = tx.Size(); return nil })
	return n + s.wal.size()
}

// WALPath returns the WAL segment that Save and Compact write, for
// messages that name the file being written. Unlike the other methods it
// does not wait for a write in flight, so a disk watchdog can call it
// while a Save hangs.
func (s *Storage) WALPath() string {
	if p := s.wal.writing.Load(); p != nil {
		return *p
	}
	return s.wal.dir
}

// Close releases the file and its lock. Later calls return ErrClosed;
// closing twice is not an error.
func (s *Storage) Close() error {
	s.snapMu.Lock() // a CreateSnapshot writing raft.db without mu finishes first
	defer s.snapMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.db == nil {
		return nil
	}
	db := s.db
	s.db = nil
	aerr := s.ack.close()
	werr := s.wal.close()
	if err := closeBolt(db, s.path); err != nil {
		return err
	}
	if werr != nil {
		return fmt.Errorf("raftlog: close %s: %w", s.wal.dir, werr)
	}
	if aerr != nil {
		return fmt.Errorf("raftlog: close %s: %w", s.ack.path, aerr)
	}
	return nil
}

func (s *Storage) closedErr(op string) error {
	return fmt.Errorf("raftlog: %s: %w", op, ErrClosed)
}
