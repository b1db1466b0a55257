package raftlog

import (
	"errors"
	"math"
	"os"
	"testing"

	"google.golang.org/protobuf/proto"
	"pgregory.net/rapid"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// TestStorageAnswersLikeMemoryStorage runs random operation sequences
// against raftlog and raft's MemoryStorage and, after every operation,
// compares every answer of the raft.Storage interface, errors included. It
// also closes and reopens the file at random points, so it checks
// durability of each operation as well as its semantics. Operations for
// which MemoryStorage panics (a gap, an index past the log) are run only
// against raftlog, which must return ErrOutOfRange and change nothing.
//
// It runs with production WAL segments and with segments so small that
// nearly every write cuts a new one, so compaction deletes segments and
// replay starts from a segment's base record.
func TestStorageAnswersLikeMemoryStorage(t *testing.T) {
	t.Run("segments=64MiB", runOracle)
	t.Run("segments=300B", func(t *testing.T) {
		withSegmentSize(t, 300)
		runOracle(t)
	})
}

// withSegmentSize lowers the segment size limit for one (non-parallel) test.
func withSegmentSize(t *testing.T, n int64) {
	old := segmentSizeLimit
	segmentSizeLimit = n
	t.Cleanup(func() { segmentSizeLimit = old })
}

func runOracle(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		dir, err := os.MkdirTemp(t.TempDir(), "oracle")
		if err != nil {
			rt.Fatal(err)
		}
		o := &oracle{rt: rt, dir: dir, ms: raft.NewMemoryStorage()}
		o.s = o.open()
		defer func() { _ = o.s.Close() }()
		ops := map[string]func(){
			"save":             o.save,
			"hardState":        o.saveHardState,
			"compact":          o.compact,
			"createSnapshot":   o.createSnapshot,
			"applySnapshot":    o.applySnapshot,
			"reopen":           o.reopen,
			"saveWithSnapshot": o.saveWithSnapshot,
		}
		names := []string{"save", "save", "save", "hardState", "compact", "createSnapshot", "applySnapshot", "reopen", "saveWithSnapshot"}
		steps := rapid.IntRange(1, 40).Draw(rt, "steps")
		for range steps {
			ops[rapid.SampledFrom(names).Draw(rt, "op")]()
			o.compare()
		}
	})
}

type oracle struct {
	rt  *rapid.T
	dir string
	s   *Storage
	ms  *raft.MemoryStorage
}

func (o *oracle) open() *Storage {
	s, err := Open(o.dir, testID)
	if err != nil {
		o.rt.Fatalf("open: %v", err)
	}
	return s
}

func (o *oracle) reopen() {
	if err := o.s.Close(); err != nil {
		o.rt.Fatalf("close: %v", err)
	}
	o.s = o.open()
}

// bounds returns the model's offset (dummy index), last index and snapshot index.
func (o *oracle) bounds() (offset, last, snap uint64) {
	first, _ := o.ms.FirstIndex()
	last, _ = o.ms.LastIndex()
	s, _ := o.ms.Snapshot()
	return first - 1, last, s.GetMetadata().GetIndex()
}

func (o *oracle) drawEntries(label string, offset, last uint64) []*raftpb.Entry {
	lo := uint64(1)
	if offset > 2 {
		lo = offset - 2
	}
	start := rapid.Uint64Range(lo, last+2).Draw(o.rt, label+"Start")
	n := rapid.IntRange(0, 6).Draw(o.rt, label+"Count")
	term := rapid.Uint64Range(1, 9).Draw(o.rt, label+"Term")
	var ents []*raftpb.Entry
	for i := range uint64(n) {
		e := &raftpb.Entry{Index: new(start + i), Term: new(term)}
		if rapid.Bool().Draw(o.rt, label+"HasData") {
			e.Data = rapid.SliceOfN(rapid.Byte(), 0, 40).Draw(o.rt, label+"Data")
		}
		if rapid.IntRange(0, 4).Draw(o.rt, label+"Bump") == 0 {
			term++
		}
		ents = append(ents, e)
	}
	return ents
}

func (o *oracle) drawHardState(label string) *raftpb.HardState {
	if rapid.Bool().Draw(o.rt, label+"Empty") {
		return &raftpb.HardState{}
	}
	return hardState(rapid.Uint64Range(0, 9).Draw(o.rt, label+"Term"),
		rapid.Uint64Range(0, 3).Draw(o.rt, label+"Vote"),
		rapid.Uint64Range(0, 50).Draw(o.rt, label+"Commit"))
}

func (o *oracle) drawConfState(label string) *raftpb.ConfState {
	voters := rapid.SliceOfNDistinct(rapid.Uint64Range(1, 5), 0, 3, rapid.ID[uint64]).Draw(o.rt, label+"Voters")
	return raftpb.EnsureConfState(&raftpb.ConfState{Voters: voters})
}

func (o *oracle) drawSnapshot(label string, minIndex, maxIndex uint64) *raftpb.Snapshot {
	md := &raftpb.SnapshotMetadata{
		Index:     new(rapid.Uint64Range(minIndex, maxIndex).Draw(o.rt, label+"Index")),
		Term:      new(rapid.Uint64Range(1, 9).Draw(o.rt, label+"Term")),
		ConfState: o.drawConfState(label),
	}
	return &raftpb.Snapshot{Metadata: md, Data: rapid.SliceOfN(rapid.Byte(), 0, 64).Draw(o.rt, label+"Data")}
}

// wouldGap reports whether appending ents to a log with the given offset and
// last index leaves a hole (MemoryStorage panics there).
func wouldGap(ents []*raftpb.Entry, offset, last uint64) bool {
	if len(ents) == 0 {
		return false
	}
	start, lastNew := ents[0].GetIndex(), ents[len(ents)-1].GetIndex()
	if lastNew < offset+1 {
		return false
	}
	return max(start, offset+1) > last+1
}

func (o *oracle) save() {
	offset, last, _ := o.bounds()
	ents := o.drawEntries("save", offset, last)
	hs := o.drawHardState("save")
	o.saveBoth(hs, ents, nil, offset, last)
}

func (o *oracle) saveHardState() {
	o.saveBoth(o.drawHardState("hs"), nil, nil, 0, 0)
}

func (o *oracle) saveWithSnapshot() {
	offset, last, snapIdx := o.bounds()
	snap := o.drawSnapshot("saveSnap", snapIdx, max(snapIdx, last)+5)
	if !raft.IsEmptySnap(snap) {
		offset, last = snap.GetMetadata().GetIndex(), snap.GetMetadata().GetIndex()
	}
	ents := o.drawEntries("saveSnap", offset, last)
	o.saveBoth(o.drawHardState("saveSnap"), ents, snap, offset, last)
}

// saveBoth runs Save on raftlog and the same steps on the model. offset and
// last describe the log the entries are appended to (after the snapshot).
func (o *oracle) saveBoth(hs *raftpb.HardState, ents []*raftpb.Entry, snap *raftpb.Snapshot, offset, last uint64) {
	err := o.s.Save(hs, ents, snap)
	_, _, curSnap := o.bounds()
	hasSnap := !raft.IsEmptySnap(snap)
	switch {
	case hasSnap && curSnap != 0 && curSnap >= snap.GetMetadata().GetIndex():
		o.expectErr("save", err, raft.ErrSnapOutOfDate)
		return
	case wouldGap(ents, offset, last):
		o.expectErr("save", err, ErrOutOfRange)
		return
	}
	if err != nil {
		o.rt.Fatalf("save: %v", err)
	}
	if hasSnap {
		if err := o.ms.ApplySnapshot(proto.Clone(snap).(*raftpb.Snapshot)); err != nil {
			o.rt.Fatalf("model apply snapshot: %v", err)
		}
	}
	if err := o.ms.Append(ents); err != nil {
		o.rt.Fatalf("model append: %v", err)
	}
	if !raft.IsEmptyHardState(hs) {
		_ = o.ms.SetHardState(hs)
	}
}

func (o *oracle) compact() {
	offset, last, _ := o.bounds()
	i := rapid.Uint64Range(max(offset, 1)-1, last+1).Draw(o.rt, "compact")
	err := o.s.Compact(i)
	if i > last {
		o.expectErr("compact", err, ErrOutOfRange)
		return
	}
	o.expectErr("compact", err, o.ms.Compact(i))
}

func (o *oracle) createSnapshot() {
	offset, last, snapIdx := o.bounds()
	i := rapid.Uint64Range(max(offset, 1)-1, last+1).Draw(o.rt, "snapIndex")
	var cs *raftpb.ConfState
	if rapid.Bool().Draw(o.rt, "snapHasConfState") {
		cs = o.drawConfState("snap")
	}
	data := rapid.SliceOfN(rapid.Byte(), 0, 64).Draw(o.rt, "snapData")
	got, err := o.s.CreateSnapshot(i, cs, data)
	switch {
	case i <= snapIdx:
		o.expectErr("create snapshot", err, raft.ErrSnapOutOfDate)
		return
	case i > last:
		o.expectErr("create snapshot", err, ErrOutOfRange)
		return
	case i < offset:
		o.expectErr("create snapshot", err, raft.ErrCompacted)
		return
	}
	want, werr := o.ms.CreateSnapshot(i, cs, data)
	o.expectErr("create snapshot", err, werr)
	if !equalSnap(got, want) {
		o.rt.Fatalf("create snapshot(%d) = %v, want %v", i, got, want)
	}
}

func (o *oracle) applySnapshot() {
	_, last, snapIdx := o.bounds()
	snap := o.drawSnapshot("apply", max(snapIdx, 1)-1, max(snapIdx, last)+5)
	err := o.s.ApplySnapshot(snap)
	o.expectErr("apply snapshot", err, o.ms.ApplySnapshot(proto.Clone(snap).(*raftpb.Snapshot)))
}

func (o *oracle) expectErr(op string, got, want error) {
	if !sameErr(got, want) {
		o.rt.Fatalf("%s: error %v, want %v", op, got, want)
	}
}

// compare checks every raft.Storage answer of raftlog against the model.
func (o *oracle) compare() {
	o.compareState()
	offset, last, _ := o.bounds()
	for i := max(offset, 2) - 2; i <= last+2; i++ {
		got, gerr := o.s.Term(i)
		want, werr := o.ms.Term(i)
		if got != want || !sameErr(gerr, werr) {
			o.rt.Fatalf("Term(%d) = %d, %v; want %d, %v", i, got, gerr, want, werr)
		}
	}
	o.compareEntries(offset+1, last+1, math.MaxUint64)
	for range rapid.IntRange(1, 4).Draw(o.rt, "entriesQueries") {
		lo := rapid.Uint64Range(max(offset, 1)-1, last+1).Draw(o.rt, "lo")
		hi := rapid.Uint64Range(lo, last+1).Draw(o.rt, "hi")
		maxSize := rapid.SampledFrom([]uint64{0, 1, 20, 40, 100, math.MaxUint64}).Draw(o.rt, "maxSize")
		o.compareEntries(lo, hi, maxSize)
	}
	_, err := o.s.Entries(offset+1, last+2, math.MaxUint64)
	if !errors.Is(err, raft.ErrUnavailable) && !errors.Is(err, raft.ErrCompacted) {
		o.rt.Fatalf("Entries past the last index: error %v, want ErrUnavailable", err)
	}
}

func (o *oracle) compareState() {
	gf, _ := o.s.FirstIndex()
	wf, _ := o.ms.FirstIndex()
	gl, _ := o.s.LastIndex()
	wl, _ := o.ms.LastIndex()
	if gf != wf || gl != wl {
		o.rt.Fatalf("FirstIndex, LastIndex = %d, %d; want %d, %d", gf, gl, wf, wl)
	}
	ghs, gcs, err := o.s.InitialState()
	whs, wcs, _ := o.ms.InitialState()
	if err != nil {
		o.rt.Fatalf("InitialState: %v", err)
	}
	if raft.IsEmptyHardState(ghs) != raft.IsEmptyHardState(whs) || !proto.Equal(raftpb.EnsureConfState(gcs), raftpb.EnsureConfState(proto.Clone(wcs).(*raftpb.ConfState))) ||
		ghs.GetTerm() != whs.GetTerm() || ghs.GetVote() != whs.GetVote() || ghs.GetCommit() != whs.GetCommit() {
		o.rt.Fatalf("InitialState = %v, %v; want %v, %v", ghs, gcs, whs, wcs)
	}
	gs, err := o.s.Snapshot()
	ws, _ := o.ms.Snapshot()
	if err != nil || !equalSnap(gs, ws) {
		o.rt.Fatalf("Snapshot = %v, %v; want %v", gs, err, ws)
	}
}

func (o *oracle) compareEntries(lo, hi, maxSize uint64) {
	got, gerr := o.s.Entries(lo, hi, maxSize)
	want, werr := o.ms.Entries(lo, hi, maxSize)
	if !sameErr(gerr, werr) || !equalEntries(got, want) {
		o.rt.Fatalf("Entries(%d, %d, %d) = %v, %v; want %v, %v", lo, hi, maxSize, got, gerr, want, werr)
	}
}
