package raftlog

import (
	"fmt"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// writer applies changes inside one bbolt read-write transaction and keeps
// st, a private copy of the Storage state, in step with them.
type writer struct {
	tx *bolt.Tx
	st *state
}

// applySnapshot replaces the whole log with snap, exactly as
// MemoryStorage.ApplySnapshot does: every stored entry goes, even those past
// the snapshot index, since raft only installs a snapshot whose index/term
// the log does not match, and the entries after it came from another
// history.
func (w *writer) applySnapshot(snap *raftpb.Snapshot) error {
	md := raftpb.EnsureSnapshotMetadata(proto.Clone(snap.GetMetadata()).(*raftpb.SnapshotMetadata))
	if cur := w.st.snap.GetIndex(); cur != 0 && cur >= md.GetIndex() {
		return raft.ErrSnapOutOfDate
	}
	// Dropping the bucket frees its pages in one step instead of deleting
	// the log key by key.
	if err := w.tx.DeleteBucket(bucketEntries); err != nil {
		return err
	}
	if _, err := w.tx.CreateBucket(bucketEntries); err != nil {
		return err
	}
	if err := w.putSnapshot(md, snap.GetData()); err != nil {
		return err
	}
	dummy := &raftpb.Entry{Index: new(md.GetIndex()), Term: new(md.GetTerm())}
	if err := w.putEntry(dummy); err != nil {
		return err
	}
	w.st.terms.resetTo(md.GetIndex(), md.GetTerm())
	w.st.last = md.GetIndex()
	return nil
}

// appendEntries stores ents with MemoryStorage.Append's semantics: entries
// at or below the offset are ignored, stored entries from ents[0]'s index on
// are replaced, and a gap after the last index is an error.
func (w *writer) appendEntries(ents []*raftpb.Entry) error {
	if len(ents) == 0 {
		return nil
	}
	if err := checkConsecutive(ents); err != nil {
		return err
	}
	first := w.st.firstIndex()
	lastNew := ents[0].GetIndex() + uint64(len(ents)) - 1
	if lastNew < first {
		return nil
	}
	if first > ents[0].GetIndex() {
		ents = ents[first-ents[0].GetIndex():]
	}
	start := ents[0].GetIndex()
	if start > w.st.last+1 {
		return fmt.Errorf("append at %d leaves a gap after last index %d: %w", start, w.st.last, ErrOutOfRange)
	}
	if err := w.deleteEntries(lastNew+1, w.st.last); err != nil {
		return err
	}
	w.st.terms.truncate(start)
	for _, e := range ents {
		if err := w.putEntry(e); err != nil {
			return err
		}
		w.st.terms.add(e.GetIndex(), e.GetTerm())
	}
	w.st.last = lastNew
	return nil
}

func checkConsecutive(ents []*raftpb.Entry) error {
	for i := 1; i < len(ents); i++ {
		if ents[i].GetIndex() != ents[i-1].GetIndex()+1 {
			return fmt.Errorf("entry %d follows %d: %w", ents[i].GetIndex(), ents[i-1].GetIndex(), ErrOutOfRange)
		}
	}
	return nil
}

// compact drops the entries before i, keeping entry i as the new dummy.
func (w *writer) compact(i uint64) error {
	offset := w.st.offset()
	if i <= offset {
		return raft.ErrCompacted
	}
	if i > w.st.last {
		return fmt.Errorf("compact %d beyond last index %d: %w", i, w.st.last, ErrOutOfRange)
	}
	if err := w.deleteEntries(offset, i-1); err != nil {
		return err
	}
	w.st.terms.compact(i)
	return nil
}

// createSnapshot records a snapshot at index i, as
// MemoryStorage.CreateSnapshot does; a nil cs keeps the previous ConfState.
func (w *writer) createSnapshot(i uint64, cs *raftpb.ConfState, data []byte) (*raftpb.Snapshot, error) {
	if i <= w.st.snap.GetIndex() {
		return nil, raft.ErrSnapOutOfDate
	}
	if i > w.st.last {
		return nil, fmt.Errorf("snapshot %d beyond last index %d: %w", i, w.st.last, ErrOutOfRange)
	}
	if i < w.st.offset() {
		return nil, raft.ErrCompacted
	}
	md := proto.Clone(w.st.snap).(*raftpb.SnapshotMetadata)
	md.Index, md.Term = new(i), new(w.st.terms.term(i))
	if cs != nil {
		md.ConfState = proto.Clone(cs).(*raftpb.ConfState)
	}
	if err := w.putSnapshot(md, data); err != nil {
		return nil, err
	}
	snap := &raftpb.Snapshot{Metadata: proto.Clone(md).(*raftpb.SnapshotMetadata), Data: cloneBytes(data)}
	return raftpb.EnsureSnapshot(snap), nil
}

func (w *writer) setHardState(hs *raftpb.HardState) error {
	v, err := sealProto(hs)
	if err != nil {
		return err
	}
	if err := w.tx.Bucket(bucketMeta).Put(keyHardState, v); err != nil {
		return err
	}
	w.st.hs = proto.Clone(hs).(*raftpb.HardState)
	return nil
}

// putSnapshot stores snapshot metadata and data; nil data is stored as
// absent so Snapshot returns nil, as MemoryStorage would.
func (w *writer) putSnapshot(md *raftpb.SnapshotMetadata, data []byte) error {
	v, err := sealProto(md)
	if err != nil {
		return err
	}
	if err := w.tx.Bucket(bucketMeta).Put(keySnapMeta, v); err != nil {
		return err
	}
	sb := w.tx.Bucket(bucketSnapshot)
	if data == nil {
		err = sb.Delete(keySnapData)
	} else {
		err = sb.Put(keySnapData, seal(data))
	}
	if err != nil {
		return err
	}
	w.st.snap = md
	return nil
}

func (w *writer) putEntry(e *raftpb.Entry) error {
	v, err := sealProto(e)
	if err != nil {
		return err
	}
	return w.tx.Bucket(bucketEntries).Put(indexKey(e.GetIndex()), v)
}

// deleteEntries deletes the stored entries lo..hi inclusive (none if lo > hi).
func (w *writer) deleteEntries(lo, hi uint64) error {
	b := w.tx.Bucket(bucketEntries)
	for i := lo; i <= hi && i >= lo; i++ {
		if err := b.Delete(indexKey(i)); err != nil {
			return err
		}
	}
	return nil
}

func cloneBytes(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte{}, b...)
}
