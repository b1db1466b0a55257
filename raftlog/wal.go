package raftlog

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"

	"google.golang.org/protobuf/proto"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/leased/leased/internal/fileutil"
)

// wal is the write-ahead log of entries and HardStates: consecutive
// segments, the last of which is appended to. The Storage's mutex guards
// it; readers only use segs and read records already written.
type wal struct {
	dir   string
	segs  []*segment // consecutive seqs, oldest first; never empty while open
	pos   int64      // write offset in the last segment
	alloc int64      // zero-filled size of the last segment
	fresh int64      // end of the last segment's base record
	// compactSeq is the segment holding the latest recCompact since the
	// last reset, 0 if none. Only segments before it may be deleted as
	// compacted: replaying from a later segment needs that record to learn
	// the offset (see replayer.base).
	compactSeq uint64
	// broken is set when a failed write could not be undone; every later
	// write returns it, since the file's tail is no longer known.
	broken error
	// writing is the last segment's path, readable without the Storage's
	// mutex: a disk watchdog names it while a write holds that mutex.
	writing atomic.Pointer[string]
}

// entryPos locates an entry's record: segment, offset and length.
type entryPos struct {
	seq uint64
	off int64
	n   int64
}

func (w *wal) last() *segment { return w.segs[len(w.segs)-1] }

// segment returns the open segment with sequence number seq, or nil.
func (w *wal) segment(seq uint64) *segment {
	if len(w.segs) == 0 || seq < w.segs[0].seq || seq > w.last().seq {
		return nil
	}
	return w.segs[seq-w.segs[0].seq]
}

// fits reports whether n more bytes belong in the current segment: a
// segment holding only its base record takes any batch.
func (w *wal) fits(n int) bool {
	return w.pos+int64(n) <= segmentSizeLimit || w.pos == w.fresh
}

// cut starts a new segment whose base record describes the log as it
// stands before the next write.
func (w *wal) cut(last point, hs *raftpb.HardState) error {
	seq := w.last().seq + 1
	base, err := baseRecord(seq, last, hs)
	if err != nil {
		return err
	}
	seg, alloc, err := createSegment(w.dir, seq, base)
	if err != nil {
		return err
	}
	seg.maxIndex = last.index
	w.segs = append(w.segs, seg)
	w.writing.Store(&seg.path)
	w.pos, w.alloc, w.fresh = int64(len(base)), alloc, int64(len(base))
	return nil
}

// write appends buf to the last segment and fdatasyncs it: the only
// fsync a Save without a snapshot costs. It returns where buf starts. On
// failure it tries to zero what it wrote, so that a later replay cannot
// pick up records the caller was told failed.
func (w *wal) write(buf []byte) (int64, error) {
	if w.broken != nil {
		return 0, w.broken
	}
	seg, off := w.last(), w.pos
	end := off + int64(len(buf))
	if end > w.alloc {
		alloc := (end + preallocChunk - 1) / preallocChunk * preallocChunk
		if err := writeZeros(seg.f, w.alloc, alloc); err != nil {
			return 0, w.undo(off, fmt.Errorf("preallocate %s: %w", seg.path, err))
		}
		w.alloc = alloc
	}
	if _, err := seg.f.WriteAt(buf, off); err != nil {
		return 0, w.undo(off, fmt.Errorf("write %s: %w", seg.path, err))
	}
	if err := fdatasync(seg.f); err != nil {
		return 0, w.undo(off, fmt.Errorf("fdatasync %s: %w", seg.path, err))
	}
	w.pos = end
	return off, nil
}

// undo zeroes the last segment from off to its allocated end and makes
// that durable, then returns cause. If that fails too the WAL is marked
// broken.
func (w *wal) undo(off int64, cause error) error {
	seg := w.last()
	err := writeZeros(seg.f, off, w.alloc)
	if err == nil {
		err = fdatasync(seg.f)
	}
	if err != nil {
		w.broken = fmt.Errorf("raftlog: %s is in an unknown state after a failed write (reopen the log): %w", seg.path, cause)
		return w.broken
	}
	w.pos = off
	return cause
}

// readEntries reads and checks the entry records at pos, all in one
// segment and in file order (see readSpan), for indexes first on.
func (w *wal) readEntries(pos []entryPos, first uint64) ([]*raftpb.Entry, error) {
	seg := w.segment(pos[0].seq)
	if seg == nil {
		return nil, fmt.Errorf("%w: entry %d: segment %d is gone", ErrCorrupt, first, pos[0].seq)
	}
	base := pos[0].off
	last := pos[len(pos)-1]
	buf := make([]byte, last.off+last.n-base)
	if _, err := seg.f.ReadAt(buf, base); err != nil {
		return nil, fmt.Errorf("read %s: %w", seg.path, err)
	}
	ents := make([]*raftpb.Entry, len(pos))
	for k, p := range pos {
		i := first + uint64(k)
		t, payload, _, err := parseRecord(buf[p.off-base : p.off-base+p.n])
		if err != nil || t != recEntry {
			return nil, fmt.Errorf("%w: %s offset %d: entry %d: record damaged", ErrCorrupt, seg.path, p.off, i)
		}
		e := &raftpb.Entry{}
		if err := proto.Unmarshal(payload, e); err != nil || e.GetIndex() != i {
			return nil, fmt.Errorf("%w: %s offset %d: entry %d does not decode", ErrCorrupt, seg.path, p.off, i)
		}
		ents[k] = e
	}
	return ents, nil
}

// dropBefore deletes the segments before seq, oldest first, so that a
// crash part way leaves a consecutive run, and syncs the directory, so
// that no file system can bring back a later one without the earlier
// (a gap is ErrCorrupt). Segments that reappear replay to the same log.
func (w *wal) dropBefore(seq uint64) error {
	if len(w.segs) < 2 || w.segs[0].seq >= seq {
		return nil
	}
	defer func() { _ = fileutil.SyncDir(w.dir) }()
	for len(w.segs) > 1 && w.segs[0].seq < seq {
		seg := w.segs[0]
		_ = seg.f.Close()
		if err := os.Remove(seg.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("raftlog: remove %s: %w", seg.path, err)
		}
		w.segs = w.segs[1:]
	}
	return nil
}

// dropCompacted deletes the oldest segments that hold nothing at or after
// offset and precede the latest compact record.
func (w *wal) dropCompacted(offset uint64) error {
	n := 0
	for n < len(w.segs)-1 && w.segs[n].seq < w.compactSeq && w.segs[n].maxIndex <= offset {
		n++
	}
	if n == 0 {
		return nil
	}
	return w.dropBefore(w.segs[n].seq)
}

// size is the bytes the segments occupy.
func (w *wal) size() int64 {
	var n int64
	for _, seg := range w.segs {
		if fi, err := seg.f.Stat(); err == nil {
			n += fi.Size()
		}
	}
	return n
}

func (w *wal) close() error {
	var first error
	for _, seg := range w.segs {
		if err := seg.f.Close(); err != nil && first == nil {
			first = err
		}
	}
	w.segs = nil
	return first
}
