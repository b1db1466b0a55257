package raftlog

import (
	"fmt"
	"os"
	"path/filepath"

	"google.golang.org/protobuf/proto"

	"go.etcd.io/raft/v3/raftpb"
)

// walFrom is raft.db's pointer to the recReset record replay starts at:
// the last snapshot installation (or the log's creation or migration).
// Records before it are superseded; a recReset after it that it does not
// point at was written by an installation whose raft.db commit never
// happened, and ends the log.
type walFrom struct {
	seq uint64
	off int64
	at  point
}

// replayer rebuilds the log state from the segments.
type replayer struct {
	st  state
	w   *wal
	seg *segment
	// provisional is set when replay had to start at a segment's base
	// record because the segments before it were deleted as compacted: the
	// offset is then only a lower bound until a recCompact at or above it
	// is read.
	provisional bool
	tail        int64 // where the records of the last segment end
	mark        markTracker
}

// replayWAL opens dir's segments and replays them from from. The segments
// before from's are superseded and deleted. A damaged or incomplete record
// is ErrCorrupt, naming the segment and offset, unless it is a write cut
// short by a crash (see tornWrite): the last record of the last segment,
// with only zeros after it. The replayed log must then satisfy raft.db's
// acked mark (guard.go; markPath names its file in the error). Only once all
// of that has passed is the last segment truncated after its last good
// record, durably, before anything is appended to it: whatever a crash
// left after that record can never be read as records, and a log that is
// refused is left exactly as it was.
func replayWAL(dir string, from walFrom, mark ackMark, markPath string) (st state, w *wal, err error) {
	seqs, err := listSegments(dir)
	if err != nil {
		return st, nil, err
	}
	w = &wal{dir: dir}
	defer func() {
		if err != nil {
			_ = w.close()
		}
	}()
	var stale []uint64
	for _, seq := range seqs {
		if seq < from.seq {
			stale = append(stale, seq)
			continue
		}
		f, err := os.OpenFile(filepath.Join(dir, segmentName(seq)), os.O_RDWR, 0)
		if err != nil {
			return st, w, fmt.Errorf("raftlog: open WAL segment: %w", err)
		}
		w.segs = append(w.segs, &segment{seq: seq, path: f.Name(), f: f})
	}
	if len(w.segs) == 0 {
		return st, w, corruptf(filepath.Join(dir, segmentName(from.seq)), "WAL segment missing")
	}
	r := &replayer{w: w, mark: markTracker{mark: mark}}
	for i, seg := range w.segs {
		if err := r.segment(seg, from, i == len(w.segs)-1); err != nil {
			return st, w, err
		}
	}
	if r.provisional {
		return st, w, corruptf(w.segs[0].path, "the segments before it are missing")
	}
	if err := r.mark.check(&r.st, markPath, w.last().path); err != nil {
		return st, w, err
	}
	last := w.last()
	if err := last.f.Truncate(r.tail); err != nil {
		return st, w, fmt.Errorf("raftlog: truncate %s: %w", last.path, err)
	}
	if err := last.f.Sync(); err != nil {
		return st, w, fmt.Errorf("raftlog: sync %s: %w", last.path, err)
	}
	w.pos, w.alloc, w.fresh = r.tail, r.tail, -1
	w.writing.Store(&last.path)
	for _, seq := range stale {
		if err := os.Remove(filepath.Join(dir, segmentName(seq))); err != nil {
			return st, w, fmt.Errorf("raftlog: remove superseded WAL segment: %w", err)
		}
	}
	return r.st, w, nil
}

// segment replays one segment file.
func (r *replayer) segment(seg *segment, from walFrom, isLast bool) error {
	buf, err := os.ReadFile(seg.path)
	if err != nil {
		return fmt.Errorf("raftlog: read %s: %w", seg.path, err)
	}
	r.seg = seg
	off, err := r.start(buf, from)
	if err != nil {
		return corruptf(seg.path, "%v", err)
	}
	r.mark.observe(&r.st)
	for {
		t, payload, n, perr := parseRecord(buf[off:])
		if perr == nil && n == 0 {
			if allZero(buf[off:]) {
				break
			}
			// Not the preallocated zeros: a damaged length, or a write
			// whose first sector never reached the disk. The two cannot be
			// told apart, so it is damage.
			return corruptf(seg.path, "offset %d: data after the end of the records", off)
		}
		if perr != nil {
			if !isLast {
				return corruptf(seg.path, "offset %d: %v", off, perr)
			}
			if why := tornWrite(buf[off:], off); why != nil {
				return corruptf(seg.path, "offset %d: %v, and not a write cut short by a crash: %v", off, perr, why)
			}
			break // a write cut short by a crash: it never returned, the log ends here
		}
		if t != recBatch {
			return corruptf(seg.path, "offset %d: record of type %d outside a batch", off, t)
		}
		if startsWithReset(payload) {
			// A snapshot installation whose raft.db commit never happened
			// (a crash between the two): it ends the log, but only as the
			// last thing written.
			if !isLast || !allZero(buf[off+int64(n):]) {
				return corruptf(seg.path, "offset %d: snapshot installation that raft.db never recorded, followed by more records", off)
			}
			break
		}
		if err := r.batch(payload, off+batchHeaderSize); err != nil {
			return corruptf(seg.path, "offset %d: %v", off, err)
		}
		r.mark.observe(&r.st)
		off += int64(n)
	}
	r.tail = off
	return nil
}

// startsWithReset reports whether a recBatch payload opens with recReset.
func startsWithReset(payload []byte) bool {
	t, _, n, err := parseRecord(payload)
	return err == nil && n > 0 && t == recReset
}

// batch replays the records of a recBatch whose payload starts at off.
func (r *replayer) batch(payload []byte, off int64) error {
	for len(payload) > 0 {
		t, body, n, err := parseRecord(payload)
		if err == nil && n == 0 {
			err = fmt.Errorf("zero length record")
		}
		if err != nil {
			return fmt.Errorf("record in batch at %d: %v", off, err)
		}
		if err := r.apply(t, body, entryPos{r.seg.seq, off, int64(n)}); err != nil {
			return err
		}
		payload, off = payload[n:], off+int64(n)
	}
	return nil
}

// start checks the segment's base record and returns where replay goes on.
// The first segment replayed starts the log: at from's reset record if it
// is from's segment, else provisionally at its base.
func (r *replayer) start(buf []byte, from walFrom) (int64, error) {
	t, payload, n, err := parseRecord(buf)
	if err == nil && (n == 0 || t != recBase) {
		err = fmt.Errorf("no base record")
	}
	if err != nil {
		return 0, fmt.Errorf("segment header: %v", err)
	}
	seq, last, hs, err := decodeBase(payload)
	if err != nil {
		return 0, err
	}
	if seq != r.seg.seq {
		return 0, fmt.Errorf("base record names segment %d", seq)
	}
	r.seg.maxIndex = last.index
	switch {
	case r.st.terms.runs == nil && r.seg.seq == from.seq:
		return r.reset(buf, from)
	case r.st.terms.runs == nil:
		r.st.terms.resetTo(last.index, last.term)
		r.st.last, r.st.hs, r.provisional = last.index, hs, true
	case r.provisional && last.index <= r.st.offset():
		// The log was cut back to or below the provisional offset, whose
		// term replay cannot know; the base record does.
		if r.st.last != r.st.offset() {
			return 0, fmt.Errorf("base record says the log ends at %d, replay has %d past the offset %d", last.index, r.st.last, r.st.offset())
		}
		if last.index == r.st.offset() {
			r.st.terms.setOffsetTerm(last.term, r.st.last)
		}
	case r.st.last != last.index || r.st.terms.term(last.index) != last.term:
		return 0, fmt.Errorf("base record says the log ends at %d (term %d), replay has %d (term %d)", last.index, last.term, r.st.last, r.st.terms.term(r.st.last))
	}
	if hs != nil {
		r.st.hs = hs
	}
	return int64(n), nil
}

// reset starts the log at the batch from points at, which must open with
// the recReset from describes.
func (r *replayer) reset(buf []byte, from walFrom) (int64, error) {
	if from.off < 0 || from.off > int64(len(buf)) {
		return 0, fmt.Errorf("raft.db points at offset %d past the end", from.off)
	}
	t, batch, n, err := parseRecord(buf[from.off:])
	if err != nil || n == 0 || t != recBatch || !startsWithReset(batch) {
		return 0, fmt.Errorf("no snapshot record at offset %d, where raft.db points", from.off)
	}
	_, payload, rn, _ := parseRecord(batch)
	p, rest, err := decodePoint(payload)
	if err != nil {
		return 0, err
	}
	if p != from.at {
		return 0, fmt.Errorf("snapshot record at offset %d is for %d (term %d), raft.db says %d (term %d)", from.off, p.index, p.term, from.at.index, from.at.term)
	}
	if r.st.hs, err = decodeHardState(rest); err != nil {
		return 0, err
	}
	r.st.terms.resetTo(p.index, p.term)
	r.st.last = p.index
	r.seg.maxIndex = max(r.seg.maxIndex, p.index)
	if err := r.batch(batch[rn:], from.off+batchHeaderSize+int64(rn)); err != nil {
		return 0, err
	}
	return from.off + int64(n), nil
}

// apply replays one record after the segment's start.
func (r *replayer) apply(t recordType, payload []byte, at entryPos) error {
	switch t {
	case recEntry:
		e := &raftpb.Entry{}
		if err := proto.Unmarshal(payload, e); err != nil {
			return fmt.Errorf("entry: %w", err)
		}
		return r.entry(e.GetIndex(), e.GetTerm(), at)
	case recHardState:
		hs, err := decodeHardState(payload)
		if err != nil {
			return err
		}
		if hs == nil {
			return fmt.Errorf("empty hardstate record")
		}
		r.st.hs = hs
		return nil
	case recCompact:
		p, _, err := decodePoint(payload)
		if err != nil {
			return err
		}
		return r.compact(p)
	}
	return fmt.Errorf("unexpected record type %d", t)
}

// entry appends or overwrites entry i, as appendEntries did.
func (r *replayer) entry(i, term uint64, at entryPos) error {
	st := &r.st
	switch {
	case i <= st.offset() && r.provisional:
		// An overwrite below the provisional offset: everything after it
		// was replaced, and it is itself compacted (a later recCompact says
		// where the log really starts).
		st.terms.truncate(st.offset() + 1)
		st.last, st.pos = st.offset(), nil
		return nil
	case i <= st.offset():
		return fmt.Errorf("entry %d at or below the offset %d", i, st.offset())
	case i > st.last+1:
		return fmt.Errorf("log gap: entry %d follows %d", i, st.last)
	}
	st.setPos(i, at)
	st.terms.truncate(i)
	st.terms.add(i, term)
	st.last = i
	r.seg.maxIndex = max(r.seg.maxIndex, i)
	return nil
}

// compact replays a recCompact record.
func (r *replayer) compact(p point) error {
	st := &r.st
	switch {
	case p.index < st.offset() && r.provisional:
		return nil // an older compaction, superseded by the one that deleted segments
	case p.index > st.last:
		return fmt.Errorf("compaction to %d beyond last index %d", p.index, st.last)
	case p.index == st.offset() && r.provisional:
		st.terms.setOffsetTerm(p.term, st.last)
	case p.index <= st.offset():
		return fmt.Errorf("compaction to %d at or below the offset %d", p.index, st.offset())
	case st.terms.term(p.index) != p.term:
		return fmt.Errorf("compaction to %d term %d, entry has term %d", p.index, p.term, st.terms.term(p.index))
	default:
		st.compactPos(p.index)
		st.terms.compact(p.index)
	}
	r.provisional = false
	r.w.compactSeq = r.seg.seq
	r.seg.maxIndex = max(r.seg.maxIndex, p.index)
	return nil
}
