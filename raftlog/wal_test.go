package raftlog

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// TestTornTailAtEveryByteReopensToThePreviousPrefix cuts the last write of
// a log short the ways a crash can: the file ending at every byte of it,
// and each sector of it, or every sector from one on, left unwritten (the
// preallocated zeros). Open must return the log as it was before that
// write, entries and HardState alike: never the write's entries without
// its HardState. raft.db and the ack file are as they were before that
// write, as after a crash (the write never returned, so nothing recorded
// it).
func TestTornTailAtEveryByteReopensToThePreviousPrefix(t *testing.T) {
	src := t.TempDir()
	s := mustOpen(t, src)
	if err := s.Save(hardState(1, 1, 5), entries(1, 6, 1), nil); err != nil {
		t.Fatal(err)
	}
	before := readLogFiles(t, src)
	if err := s.Save(hardState(2, 1, 60), entries(6, 61, 2), nil); err != nil {
		t.Fatal(err)
	}
	segPath := s.wal.last().path
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	seg, err := os.ReadFile(segPath)
	if err != nil {
		t.Fatal(err)
	}
	offs := recordOffsets(seg) // base, the empty log's reset, the two Saves, end
	if len(offs) != 5 {
		t.Fatalf("segment has records at %v, want base, reset and two batches", offs)
	}
	lastStart, lastEnd := offs[3], offs[4]
	if lastEnd-lastStart < 3*sectorSize {
		t.Fatalf("the last write is %d bytes; the test needs it to span several sectors", lastEnd-lastStart)
	}
	torn := map[string][]byte{}
	// Every byte of the header and of the first inner record, then a
	// sample (each Open costs several fsyncs; a sparser one under -short),
	// and around sector ends.
	every := 29
	if testing.Short() {
		every = 97
	}
	for cut := lastStart; cut < lastEnd; cut++ {
		if cut-lastStart < 64 || cut%sectorSize < 2 || cut%sectorSize > sectorSize-2 || cut%every == 0 {
			torn[fmt.Sprintf("file ends at %d", cut)] = seg[:cut]
		}
	}
	firstSector := lastStart / sectorSize * sectorSize
	var headerLost []byte
	for sec := firstSector; sec < lastEnd; sec += sectorSize {
		from, to := max(sec, lastStart), min(sec+sectorSize, lastEnd)
		one := bytes.Clone(seg)
		clear(one[from:to])
		rest := bytes.Clone(seg)
		clear(rest[from:lastEnd])
		torn[fmt.Sprintf("sectors from %d unwritten", sec)] = rest
		if sec == firstSector {
			headerLost = one
			continue
		}
		torn[fmt.Sprintf("sector at %d unwritten", sec)] = one
	}
	for name, img := range torn {
		dir := withSegment(t, src, before, segPath, img)
		s, err := Open(dir, testID)
		if err != nil {
			t.Fatalf("%s: Open: %v", name, err)
		}
		checkLog(t, s, 1, 5, hardState(1, 1, 5))
		// The log goes on from there, and keeps what it is given, also once
		// the torn segment is no longer the last (this Save cuts a new one).
		limit := segmentSizeLimit
		segmentSizeLimit = 1
		err = s.Save(hardState(3, 1, 7), entries(6, 8, 3), nil)
		segmentSizeLimit = limit
		if err != nil {
			t.Fatal(err)
		}
		if n := len(s.wal.segs); n != 2 {
			t.Fatalf("%d segments after a Save past the size limit, want 2", n)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		checkLog(t, mustOpen(t, dir), 1, 7, hardState(3, 1, 7))
	}
	// A write whose first sector never reached the disk but whose later ones
	// did cannot be told from a damaged length: refused, never shortened.
	dir := withSegment(t, src, before, segPath, headerLost)
	expectCorrupt(t, dir, filepath.Join(dir, walDirName, filepath.Base(segPath)), "header sector unwritten")
	checkLog(t, mustOpen(t, src), 1, 60, hardState(2, 1, 60))
}

// withSegment copies the log in src, with raft.db and the ack file as in
// before and the segment at segPath replaced by img, into a new directory.
func withSegment(t *testing.T, src string, before map[string][]byte, segPath string, img []byte) string {
	t.Helper()
	dir := copyLog(t, src)
	for _, name := range []string{fileName, ackFileName} {
		if err := os.WriteFile(filepath.Join(dir, name), before[name], 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, walDirName, filepath.Base(segPath)), img, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// expectCorrupt opens dir and expects ErrCorrupt naming path, with every
// file left as it was.
func expectCorrupt(t *testing.T, dir, path, what string) {
	t.Helper()
	before := readLogFiles(t, dir)
	s, err := Open(dir, testID)
	if err == nil {
		_ = s.Close()
		t.Fatalf("%s: Open succeeded; want ErrCorrupt naming %s", what, path)
	}
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), path) {
		t.Fatalf("%s: Open: %v; want ErrCorrupt naming %s", what, err, path)
	}
	if after := readLogFiles(t, dir); !equalFiles(before, after) {
		t.Fatalf("%s: Open changed the files it refused", what)
	}
}

// TestDamageBeforeTheLastSegmentIsCorrupt flips one bit at a time in the
// records of every segment but the last: Open must fail with ErrCorrupt
// naming that segment, and change no file.
func TestDamageBeforeTheLastSegmentIsCorrupt(t *testing.T) {
	withSegmentSize(t, 512)
	src := t.TempDir()
	s := mustOpen(t, src)
	for i := uint64(1); i <= 60; i += 6 {
		if err := s.Save(hardState(1, 1, i), entries(i, i+6, 1), nil); err != nil {
			t.Fatal(err)
		}
	}
	if len(s.wal.segs) < 4 {
		t.Fatalf("only %d segments; the test needs several", len(s.wal.segs))
	}
	segs := append([]*segment(nil), s.wal.segs[:len(s.wal.segs)-1]...)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, seg := range segs {
		img, err := os.ReadFile(seg.path)
		if err != nil {
			t.Fatal(err)
		}
		end := recordsEnd(img)
		step := 3
		if testing.Short() { // a sample: every 13th byte
			step = 13
		}
		for off := 0; off < end; off += step {
			dir := copyLog(t, src)
			path := filepath.Join(dir, walDirName, filepath.Base(seg.path))
			bad := append([]byte(nil), img...)
			bad[off] ^= 1 << (off % 8)
			if err := os.WriteFile(path, bad, 0o600); err != nil {
				t.Fatal(err)
			}
			before := readLogFiles(t, dir)
			_, err := Open(dir, testID)
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), path) {
				t.Fatalf("%s byte %d flipped: Open: %v; want ErrCorrupt naming the segment", seg.path, off, err)
			}
			if after := readLogFiles(t, dir); !equalFiles(before, after) {
				t.Fatalf("%s byte %d flipped: Open changed the files it rejected", seg.path, off)
			}
		}
	}
}

// TestOverwriteOfAnUncommittedSuffixSurvivesReopen overwrites a suffix,
// one stored in the same segment and one reaching back into earlier
// segments, and checks the reopened log holds the new entries only.
func TestOverwriteOfAnUncommittedSuffixSurvivesReopen(t *testing.T) {
	for _, size := range []int64{64 << 20, 300} {
		withSegmentSize(t, size)
		dir := t.TempDir()
		s := mustOpen(t, dir)
		for i := uint64(1); i <= 30; i += 5 {
			if err := s.Save(hardState(1, 1, 3), entries(i, i+5, 1), nil); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Save(hardState(2, 2, 3), entries(12, 15, 2), nil); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s = mustOpen(t, dir)
		want := append(entries(1, 12, 1), entries(12, 15, 2)...)
		got, err := s.Entries(1, 15, 1<<30)
		if err != nil || !equalEntries(got, want) {
			t.Fatalf("segments of %d: Entries = %d entries, %v; want 1..14 with 12.. of term 2", size, len(got), err)
		}
		if last, _ := s.LastIndex(); last != 14 {
			t.Fatalf("segments of %d: LastIndex %d, want 14", size, last)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCompactDeletesWholeSegments keeps saving and compacting with small
// segments: the number of segment files must stay bounded, and the log
// reopens with the compacted offset and its term.
func TestCompactDeletesWholeSegments(t *testing.T) {
	withSegmentSize(t, 1024)
	dir := t.TempDir()
	s := mustOpen(t, dir)
	maxFiles := 0
	for i := uint64(1); i <= 2000; i += 10 {
		if err := s.Save(hardState(1, 1, i+9), entries(i, i+10, 1+i/500), nil); err != nil {
			t.Fatal(err)
		}
		if i > 100 && i%100 == 1 {
			if err := s.Compact(i - 50); err != nil {
				t.Fatal(err)
			}
		}
		maxFiles = max(maxFiles, countSegments(t, dir))
	}
	if maxFiles > 20 {
		t.Fatalf("up to %d segment files; compaction should keep it near 100 entries' worth", maxFiles)
	}
	first, _ := s.FirstIndex()
	term, _ := s.Term(first - 1)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, dir)
	if f, _ := s.FirstIndex(); f != first {
		t.Fatalf("FirstIndex after reopen %d, want %d", f, first)
	}
	if tm, _ := s.Term(first - 1); tm != term {
		t.Fatalf("Term(%d) after reopen %d, want %d", first-1, tm, term)
	}
	if _, err := s.Term(first - 2); err != raft.ErrCompacted {
		t.Fatalf("Term below the offset: %v, want ErrCompacted", err)
	}
	checkLog(t, s, first, 2000, hardState(1, 1, 2000))
}

// TestSnapshotInstallCrashAtEachStep copies the files at each step of a
// snapshot installation (what a crash there would leave) and checks each
// copy reopens as the old log or the new one, nothing in between; and
// that a failed raft.db commit leaves no trace once later writes succeed.
func TestSnapshotInstallCrashAtEachStep(t *testing.T) {
	src := t.TempDir()
	s := mustOpen(t, src)
	if err := s.Save(hardState(1, 1, 10), entries(1, 11, 1), nil); err != nil {
		t.Fatal(err)
	}
	copies := map[string]string{}
	commitHook = func(step string) error {
		copies[step] = copyLog(t, src)
		return nil
	}
	t.Cleanup(func() { commitHook = func(string) error { return nil } })
	snap := &raftpb.Snapshot{
		Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(50)), Term: new(uint64(3)), ConfState: &raftpb.ConfState{Voters: []uint64{1}}},
		Data:     []byte("state at 50"),
	}
	if err := s.Save(hardState(3, 1, 52), entries(51, 53, 3), snap); err != nil {
		t.Fatal(err)
	}
	checkLog(t, mustOpen(t, copies["wal written"]), 1, 10, hardState(1, 1, 10))
	checkLog(t, mustOpen(t, copies["raft.db committed"]), 51, 52, hardState(3, 1, 52))

	commitHook = func(string) error { return errors.New("injected raft.db failure") }
	snap2 := &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(60)), Term: new(uint64(4))}}
	if err := s.ApplySnapshot(snap2); err == nil {
		t.Fatal("ApplySnapshot succeeded despite the failure")
	}
	commitHook = func(string) error { return nil }
	checkLog(t, s, 51, 52, hardState(3, 1, 52))
	if err := s.Save(hardState(3, 1, 54), entries(53, 55, 3), nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, src)
	checkLog(t, s, 51, 54, hardState(3, 1, 54))
	if got, _ := s.Snapshot(); got.GetMetadata().GetIndex() != 50 {
		t.Fatalf("snapshot at %d, want 50", got.GetMetadata().GetIndex())
	}
}

// checkLog checks s holds exactly [first, last] with the payloads entry()
// gives (any term) and the HardState hs.
func checkLog(t *testing.T, s *Storage, first, last uint64, hs *raftpb.HardState) {
	t.Helper()
	f, _ := s.FirstIndex()
	l, _ := s.LastIndex()
	if f != first || l != last {
		t.Fatalf("log [%d, %d], want [%d, %d]", f, l, first, last)
	}
	ents, err := s.Entries(first, last+1, 1<<40)
	if err != nil || uint64(len(ents)) != last-first+1 {
		t.Fatalf("Entries(%d, %d): %d entries, %v", first, last+1, len(ents), err)
	}
	for _, e := range ents {
		if !bytes.Equal(e.GetData(), payload(e.GetIndex(), e.GetTerm())) {
			t.Fatalf("entry %v has another entry's payload", e)
		}
	}
	got, _, _ := s.InitialState()
	if got.String() != hs.String() {
		t.Fatalf("HardState %v, want %v", got, hs)
	}
}

// recordOffsets returns where each top-level record of a segment starts,
// and where the records end.
func recordOffsets(b []byte) []int {
	var offs []int
	off := 0
	for {
		offs = append(offs, off)
		_, _, n, err := parseRecord(b[off:])
		if err != nil || n == 0 {
			return offs
		}
		off += n
	}
}

// copyLog copies a data dir (raft.db, acked and wal/) into a new temp dir.
func copyLog(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	for name, b := range readLogFiles(t, src) {
		path := filepath.Join(dst, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// readLogFiles returns raft.db, the ack file and the segments, by path
// relative to dir.
func readLogFiles(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	names, _ := filepath.Glob(filepath.Join(dir, walDirName, "*"))
	for _, name := range append(names, filepath.Join(dir, fileName), filepath.Join(dir, ackFileName)) {
		b, err := os.ReadFile(name)
		if errors.Is(err, fs.ErrNotExist) && filepath.Base(name) == ackFileName {
			continue // a format 2 directory
		}
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(dir, name)
		files[rel] = b
	}
	return files
}

func equalFiles(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !bytes.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

func countSegments(t *testing.T, dir string) int {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, walDirName, "*.wal"))
	if err != nil {
		t.Fatal(err)
	}
	return len(names)
}

// TestProvisionalReplayLearnsTheOffsetTermAlone: replay that starts at a
// segment's base record (the segments before it deleted as compacted)
// learns the offset's real term only from the compaction record; setting it
// must not change the term of the entries after the offset that share the
// base's term (they did, and the log reopened with a wrong term for them).
// raft's own logs never have a term drop after an overwrite, but raft's
// MemoryStorage answers for any history, and so must Storage.
func TestProvisionalReplayLearnsTheOffsetTermAlone(t *testing.T) {
	withSegmentSize(t, 300)
	dir := t.TempDir()
	s := mustOpen(t, dir)
	bare := func(lo, hi, term uint64) []*raftpb.Entry { // no payload: the second segment holds them all
		var ents []*raftpb.Entry
		for i := lo; i < hi; i++ {
			ents = append(ents, &raftpb.Entry{Index: new(i), Term: new(term)})
		}
		return ents
	}
	steps := []func() error{
		func() error { return s.Save(nil, entries(1, 11, 1), nil) }, // fills the first segment
		func() error { return s.Save(nil, bare(1, 2, 2), nil) },     // cuts: base record (10, term 1)
		func() error { return s.Save(nil, append(bare(2, 11, 2), bare(11, 12, 1)...), nil) },
		func() error { return s.Compact(10) }, // deletes the first segment: replay starts at the base record
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	if n := countSegments(t, dir); n != 1 {
		t.Fatalf("%d segments after the compaction, want 1 (the set-up no longer replays from a base record)", n)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, dir)
	for i, want := range map[uint64]uint64{10: 2, 11: 1} {
		if got, err := s.Term(i); err != nil || got != want {
			t.Errorf("Term(%d) after reopen = %d, %v; want %d", i, got, err, want)
		}
	}
}
