package raftlog

import (
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Save makes one Ready's worth of state durable as one WAL batch (one
// write, one fdatasync): first the snapshot if it is not empty (replacing
// the whole log, as ApplySnapshot does; it also costs a bbolt commit), then
// the entries (replacing any stored suffix they overlap, ignoring any at or
// below the offset), then the HardState if it is not empty. Either all of
// it is on disk when Save returns nil, or none of it is and the Storage is
// unchanged.
//
// Entries must be consecutive and must not leave a gap after LastIndex
// (ErrOutOfRange); a snapshot older than the stored one is
// raft.ErrSnapOutOfDate.
func (s *Storage) Save(hs *raftpb.HardState, ents []*raftpb.Entry, snap *raftpb.Snapshot) error {
	hasSnap, hasHS := !raft.IsEmptySnap(snap), !raft.IsEmptyHardState(hs)
	if !hasSnap && !hasHS && len(ents) == 0 {
		return nil
	}
	if hasSnap {
		s.snapMu.Lock()
		defer s.snapMu.Unlock()
	}
	return s.update("save", func(w *writer) error {
		if hasSnap {
			if err := w.applySnapshot(snap); err != nil {
				return err
			}
		}
		if err := w.appendEntries(ents); err != nil {
			return err
		}
		if hasHS {
			return w.setHardState(hs)
		}
		return nil
	})
}

// ApplySnapshot replaces the log with snap in its own transaction, like
// MemoryStorage.ApplySnapshot: all stored entries are dropped, the snapshot
// becomes the offset. An index not above the stored snapshot's (unless both
// are 0, the bootstrap case) is raft.ErrSnapOutOfDate, returned bare.
func (s *Storage) ApplySnapshot(snap *raftpb.Snapshot) error {
	s.snapMu.Lock()
	defer s.snapMu.Unlock()
	return s.update("apply snapshot", func(w *writer) error { return w.applySnapshot(snap) })
}

// Compact discards the entries before compactIndex, which stays as the
// offset whose term Term still reports. compactIndex at or below the offset
// is raft.ErrCompacted (bare); beyond LastIndex is ErrOutOfRange. It costs
// one WAL write and fdatasync, then deletes the segments it emptied.
func (s *Storage) Compact(compactIndex uint64) error {
	return s.update("compact", func(w *writer) error { return w.compact(compactIndex) })
}

// CreateSnapshot durably records a snapshot of the state machine at index i
// with the given data; cs replaces the stored ConfState unless nil. It does
// not compact the log; call Compact for that. i not above the stored
// snapshot's index is raft.ErrSnapOutOfDate (bare), i beyond LastIndex is
// ErrOutOfRange, i below the offset is raft.ErrCompacted. The returned
// snapshot's Data is data itself.
//
// Unlike the other writes it does not hold the log while it writes: a
// snapshot is the whole state (tens of MB at a million leases) and its
// bbolt commit takes as long as the disk needs for it, while Save must go on
// appending meanwhile (a raft node that cannot append for seconds loses its
// leadership). Entry i is committed, so nothing an append does can change
// it; the snapshot writers exclude each other (snapMu), and the snapshot
// becomes the stored one only once raft.db has it.
func (s *Storage) CreateSnapshot(i uint64, cs *raftpb.ConfState, data []byte) (*raftpb.Snapshot, error) {
	s.snapMu.Lock()
	defer s.snapMu.Unlock()
	md, db, err := s.snapshotAt(i, cs)
	if err != nil {
		return nil, err
	}
	err = guard(s.path, func() error {
		return db.Update(func(tx *bolt.Tx) error {
			if err := commitHook("snapshot writing"); err != nil {
				return err
			}
			return putSnapshot(tx, md, data)
		})
	})
	if err != nil {
		return nil, fmt.Errorf("raftlog: create snapshot: %w", err)
	}
	s.mu.Lock()
	s.st.snap = md // st's fields are replaced, never changed in place: readers' copies keep the old one
	s.mu.Unlock()
	return raftpb.EnsureSnapshot(&raftpb.Snapshot{Metadata: proto.Clone(md).(*raftpb.SnapshotMetadata), Data: data}), nil
}

// snapshotAt checks that a snapshot at i may be created and returns its
// metadata and the open raft.db to write to.
func (s *Storage) snapshotAt(i uint64, cs *raftpb.ConfState) (*raftpb.SnapshotMetadata, *bolt.DB, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	switch {
	case s.db == nil:
		return nil, nil, s.closedErr("create snapshot")
	case i <= s.st.snap.GetIndex():
		return nil, nil, raft.ErrSnapOutOfDate
	case i > s.st.last:
		return nil, nil, fmt.Errorf("raftlog: create snapshot: snapshot %d beyond last index %d: %w", i, s.st.last, ErrOutOfRange)
	case i < s.st.offset():
		return nil, nil, raft.ErrCompacted
	}
	md := proto.Clone(s.st.snap).(*raftpb.SnapshotMetadata)
	md.Index, md.Term = new(i), new(s.st.terms.term(i))
	if cs != nil {
		md.ConfState = proto.Clone(cs).(*raftpb.ConfState)
	}
	return md, s.db, nil
}

// update runs fn over a copy of the state, then makes its changes durable
// (commit) and installs the copy only if that succeeds. raft's own
// sentinels pass through unwrapped, since raft-style callers compare them
// with ==. A panic in bbolt (damage Open could not see) is rolled back by
// bbolt and reported as ErrCorrupt.
func (s *Storage) update(op string, fn func(*writer) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.db == nil {
		return s.closedErr(op)
	}
	next := s.st.clone()
	w := newWriter(&next)
	err := fn(w)
	if err == nil {
		err = s.commit(w)
	}
	switch {
	case err == nil:
		s.st = next
		s.dropSegments(w)
		return nil
	case err == raft.ErrCompacted, err == raft.ErrSnapOutOfDate:
		return err
	case errors.Is(err, ErrCorrupt):
		return err // from guard, already naming the file
	}
	return fmt.Errorf("raftlog: %s: %w", op, err)
}

// commit makes w's changes durable. WAL records go first, in one write
// and one fdatasync; a snapshot then goes to raft.db in one bbolt
// transaction that also points walfrom at the WAL's recReset record. A
// crash between the two leaves a recReset raft.db does not point at,
// which replay treats as the end of the log: the whole operation is lost,
// never half of it. If the bbolt commit fails the WAL write is undone.
func (s *Storage) commit(w *writer) error {
	var seq uint64
	var off int64
	if !w.empty() {
		sealBatch(w.buf)
		if !s.wal.fits(len(w.buf)) {
			if err := s.wal.cut(s.st.point(s.st.last), s.st.hs); err != nil {
				return err
			}
		}
		seq = s.wal.last().seq
		var err error
		if off, err = s.wal.write(w.buf); err != nil {
			return err
		}
	}
	if w.snap != nil { // the caller holds snapMu
		if err := s.commitDB(w, seq, off); err != nil {
			return s.wal.undo(off, err)
		}
	}
	if err := s.recordMark(w); err != nil {
		return err
	}
	if !w.empty() {
		w.placeEntries(seq, off)
		seg := s.wal.last()
		seg.maxIndex = max(seg.maxIndex, w.maxIdx)
		if w.reset {
			s.wal.compactSeq = 0
		}
		if w.compacted {
			s.wal.compactSeq = seq
		}
	}
	return nil
}

// recordMark moves the ack file's mark to the state w leaves, whose WAL
// records are durable by now, if w appends entries, installs a snapshot or
// changes the term or the vote: what raft may acknowledge or vote on once
// Save returns. A failed write leaves the WAL as it is (the batch is
// durable; the mark, in either slot, claims no more than it) and marks it
// broken, so the log must be reopened.
func (s *Storage) recordMark(w *writer) error {
	if len(w.pending) == 0 && w.snap == nil && !termOrVoteChanged(s.st.hs, w.st.hs) {
		return nil
	}
	if err := s.ack.record(markOf(w.st)); err != nil {
		s.wal.broken = fmt.Errorf("raftlog: %w (reopen the log)", err)
		return s.wal.broken
	}
	return nil
}

// commitDB stores w's snapshot, if any, in raft.db and, for an
// installation, points walfrom at the batch just written at (seq, off).
func (s *Storage) commitDB(w *writer, seq uint64, off int64) error {
	if err := commitHook("wal written"); err != nil {
		return err
	}
	err := guard(s.path, func() error {
		return s.db.Update(func(tx *bolt.Tx) error {
			if err := putSnapshot(tx, w.snap, w.snapData); err != nil {
				return err
			}
			if !w.reset {
				return nil
			}
			from := walFrom{seq: seq, off: off, at: point{w.snap.GetIndex(), w.snap.GetTerm()}}
			return tx.Bucket(bucketMeta).Put(keyWALFrom, from.encode())
		})
	})
	if err == nil {
		_ = commitHook("raft.db committed")
	}
	return err
}

// commitHook lets tests observe (by copying the files: what a crash there
// would leave) or fail a snapshot installation between its steps, and hold
// CreateSnapshot's raft.db write ("snapshot writing").
var commitHook = func(step string) error { return nil }

// dropSegments deletes the segments a committed operation made
// unnecessary. It runs after the operation is durable and reported as
// such, so a failure only leaves files that the next Compact or Open
// deletes.
func (s *Storage) dropSegments(w *writer) {
	switch {
	case w.reset:
		_ = s.wal.dropBefore(s.wal.last().seq)
	case w.compacted:
		_ = s.wal.dropCompacted(s.st.offset())
	}
}
