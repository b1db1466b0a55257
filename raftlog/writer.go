package raftlog

import (
	"fmt"
	"slices"

	"google.golang.org/protobuf/proto"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// writer collects one operation's changes: WAL records in buf, and for
// snapshots the raft.db update, while keeping st, a private copy of the
// Storage state, in step with them. Storage.update makes them durable and
// installs st only if that succeeds.
type writer struct {
	st  *state
	buf []byte // one recBatch record (newBatch), written with one write and one fdatasync

	pending []pendingEntry // entry records in buf, positioned after the write
	maxIdx  uint64         // highest index buf's records name

	reset     bool                     // buf starts with a recReset
	snap      *raftpb.SnapshotMetadata // non-nil: raft.db gets this snapshot
	snapData  []byte
	compacted bool // buf holds a recCompact
}

// pendingEntry is an entry record at rel in buf, n bytes long.
type pendingEntry struct {
	index uint64
	rel   int
	n     int
}

func newWriter(st *state) *writer { return &writer{st: st, buf: newBatch()} }

// empty reports whether the operation writes nothing to the WAL.
func (w *writer) empty() bool { return len(w.buf) == batchHeaderSize }

// applySnapshot replaces the whole log with snap, exactly as
// MemoryStorage.ApplySnapshot does: every stored entry goes, even those past
// the snapshot index, since raft only installs a snapshot whose index/term
// the log does not match, and the entries after it came from another
// history. The WAL gets a recReset record that raft.db's walfrom will
// point at once the snapshot is committed there.
func (w *writer) applySnapshot(snap *raftpb.Snapshot) error {
	md := raftpb.EnsureSnapshotMetadata(proto.Clone(snap.GetMetadata()).(*raftpb.SnapshotMetadata))
	if cur := w.st.snap.GetIndex(); cur != 0 && cur >= md.GetIndex() {
		return raft.ErrSnapOutOfDate
	}
	if !w.empty() {
		return fmt.Errorf("internal error: snapshot after other records in one write")
	}
	var err error
	if w.buf, err = appendReset(w.buf, point{md.GetIndex(), md.GetTerm()}, w.st.hs); err != nil {
		return err
	}
	w.reset = true
	w.maxIdx = max(w.maxIdx, md.GetIndex())
	w.snap, w.snapData = md, snap.GetData()
	w.st.snap = md
	w.st.terms.resetTo(md.GetIndex(), md.GetTerm())
	w.st.last = md.GetIndex()
	w.st.pos = nil
	w.st.recent, w.st.recentSizes, w.st.recentBytes = nil, nil, 0
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
	w.st.terms.truncate(start)
	sizes := make([]int32, 0, len(ents)) // the entries' proto sizes, for the recent cache: each record's payload less its type byte
	w.buf = slices.Grow(w.buf, recordsSize(ents))
	for _, e := range ents {
		rel := len(w.buf)
		var err error
		if w.buf, err = appendProtoRecord(w.buf, recEntry, e); err != nil {
			return err
		}
		w.pending = append(w.pending, pendingEntry{e.GetIndex(), rel, len(w.buf) - rel})
		w.st.terms.add(e.GetIndex(), e.GetTerm())
		sizes = append(sizes, int32(len(w.buf)-rel-recordHeaderSize-1))
	}
	w.st.cacheAppend(start, ents, sizes)
	w.st.last = lastNew
	w.maxIdx = max(w.maxIdx, lastNew)
	return nil
}

// recordsSize is the bytes ents take as entry records. Growing the batch to
// it once spares the copies of growing it record by record: a Ready of large
// entries (a leader's idle checkpoints after a mass disconnect, 25 MiB) was
// copied over and over, into fresh pages each time.
func recordsSize(ents []*raftpb.Entry) int {
	n := 0
	for _, e := range ents {
		n += recordHeaderSize + 1 + proto.Size(e)
	}
	return n
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
	p := w.st.point(i)
	w.buf = appendRecord(w.buf, recCompact, appendPoint(nil, p))
	w.compacted = true
	w.maxIdx = max(w.maxIdx, i)
	w.st.compactPos(i)
	w.st.cacheCompact(i)
	w.st.terms.compact(i)
	return nil
}

func (w *writer) setHardState(hs *raftpb.HardState) error {
	var err error
	if w.buf, err = appendProtoRecord(w.buf, recHardState, hs); err != nil {
		return err
	}
	w.st.hs = proto.Clone(hs).(*raftpb.HardState)
	return nil
}

// placeEntries records where the entry records landed once buf was
// written at off in segment seq. Positions point at the inner records, so
// reading an entry checks its own checksum only.
func (w *writer) placeEntries(seq uint64, off int64) {
	for _, p := range w.pending {
		w.st.setPos(p.index, entryPos{seq, off + int64(p.rel), int64(p.n)})
	}
}

func cloneBytes(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte{}, b...)
}
