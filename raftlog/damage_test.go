package raftlog

import (
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

// stoppedLog writes a log of a few hundred entries in many Saves, with a
// term change now and then and a compaction, closes it and returns its
// directory and what it holds.
func stoppedLog(t *testing.T) (dir string, want []*raftpb.Entry, hs *raftpb.HardState) {
	t.Helper()
	dir = t.TempDir()
	s := mustOpen(t, dir)
	term := uint64(1)
	for i := uint64(1); i <= 300; i += 10 {
		if i%70 == 1 {
			term++
		}
		hs = hardState(term, 1+term%3, i+9)
		if err := s.Save(hs, entries(i, i+10, term), nil); err != nil {
			t.Fatal(err)
		}
		if i == 151 {
			if err := s.Compact(40); err != nil {
				t.Fatal(err)
			}
		}
	}
	want, err := s.Entries(41, 301, 1<<40)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return dir, want, hs
}

// damageCase reports the outcome of opening a damaged copy of a log:
// ErrCorrupt naming the damaged file with every file left as it was, or a
// log holding every entry and the HardState. Anything else fails t.
func damageCase(t *testing.T, dir, damaged, what string, want []*raftpb.Entry, hs *raftpb.HardState) (refused bool) {
	t.Helper()
	before := readLogFiles(t, dir)
	s, err := Open(dir, testID)
	if err != nil {
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), damaged) {
			t.Fatalf("%s: Open: %v; want ErrCorrupt naming %s", what, err, damaged)
		}
		if after := readLogFiles(t, dir); !equalFiles(before, after) {
			t.Fatalf("%s: Open changed the files it refused", what)
		}
		return true
	}
	defer s.Close()
	first, _ := s.FirstIndex()
	last, _ := s.LastIndex()
	got, err := s.Entries(first, last+1, 1<<40)
	if err != nil || !equalEntries(got, want) {
		t.Fatalf("%s: Open succeeded holding [%d, %d] (%v); want every entry of [%d, %d]",
			what, first, last, err, want[0].GetIndex(), want[len(want)-1].GetIndex())
	}
	if h, _, _ := s.InitialState(); h.String() != hs.String() {
		t.Fatalf("%s: Open succeeded with HardState %v, want %v", what, h, hs)
	}
	return false
}

// TestFlippedWALByteIsRefusedOrLosesNothing flips one byte at a time (a
// seeded sample of positions, every record header among them, bounded in
// time) in the WAL of a stopped log, whose one segment is the newest: Open
// must refuse with ErrCorrupt naming the segment and leave the files as
// they were, or hold every entry and the HardState. Before a torn write
// had to look like one, any damage in the newest segment cut the log
// there, silently.
func TestFlippedWALByteIsRefusedOrLosesNothing(t *testing.T) {
	src, want, hs := stoppedLog(t)
	segs, _ := filepath.Glob(filepath.Join(src, walDirName, "*.wal"))
	if len(segs) != 1 {
		t.Fatalf("%d segments; the test wants the whole log in the newest", len(segs))
	}
	img, err := os.ReadFile(segs[0])
	if err != nil {
		t.Fatal(err)
	}
	end := recordsEnd(img)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	var headers []int
	for _, off := range recordOffsets(img[:end]) {
		for k := range batchHeaderSize {
			headers = append(headers, off+k)
		}
	}
	positions := append(headers, rng.Perm(end+sectorSize)...)
	budget := 20 * time.Second
	if testing.Short() {
		budget = time.Second
	}
	deadline := time.Now().Add(budget)
	tried, refused := 0, 0
	for _, p := range positions {
		if time.Now().After(deadline) {
			break
		}
		bad := append([]byte(nil), img...)
		bad[p] ^= byte(1 + rng.IntN(255))
		dir := copyLog(t, src)
		path := filepath.Join(dir, walDirName, filepath.Base(segs[0]))
		if err := os.WriteFile(path, bad, 0o600); err != nil {
			t.Fatal(err)
		}
		if damageCase(t, dir, path, "WAL byte "+strconv.Itoa(p)+" flipped", want, hs) {
			refused++
		}
		tried++
		_ = os.RemoveAll(dir)
	}
	t.Logf("%d positions tried (of %d record bytes and the sector after them): %d refused, %d opened whole",
		tried, end, refused, tried-refused)
	if tried < 20 {
		t.Fatalf("only %d positions tried within %v", tried, budget)
	}
}

// TestDamagedRaftDBPageIsRefusedOrLosesNothing flips one byte at a time (a
// seeded sample, both meta pages among them) in the pages of a stopped
// log's raft.db: Open must refuse with ErrCorrupt naming the file, or
// hold every entry and the HardState. A damaged meta page in particular
// must not make bbolt fall back, silently, to the transaction before.
func TestDamagedRaftDBPageIsRefusedOrLosesNothing(t *testing.T) {
	src, want, hs := stoppedLog(t)
	s := mustOpen(t, src)
	if _, err := s.CreateSnapshot(200, &raftpb.ConfState{Voters: []uint64{1}}, []byte("state at 200")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	dbPath := filepath.Join(src, fileName)
	img, err := os.ReadFile(dbPath)
	if err != nil {
		t.Fatal(err)
	}
	m := decodeMeta(img)
	if !m.valid {
		t.Fatal("raft.db's first meta page is invalid")
	}
	used := int(m.pgid) * int(m.pageSize)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 8))
	var metas []int // the fields of both meta pages
	for _, page := range []int{0, int(m.pageSize)} {
		for k := pageHeaderSize; k < pageHeaderSize+metaSize; k++ {
			metas = append(metas, page+k)
		}
	}
	positions := append(metas, rng.Perm(used)...)
	budget := 15 * time.Second
	if testing.Short() {
		budget = time.Second
	}
	deadline := time.Now().Add(budget)
	tried, refused := 0, 0
	for k, p := range positions {
		if time.Now().After(deadline) {
			break
		}
		bad := append([]byte(nil), img...)
		bad[p] ^= byte(1 + rng.IntN(255))
		dir := copyLog(t, src)
		if err := os.WriteFile(filepath.Join(dir, fileName), bad, 0o600); err != nil {
			t.Fatal(err)
		}
		wasRefused := damageCase(t, dir, filepath.Join(dir, fileName), "raft.db byte "+strconv.Itoa(p)+" flipped", want, hs)
		if k < len(metas) && !wasRefused {
			t.Fatalf("raft.db meta page byte %d flipped: Open succeeded; a damaged meta page must be refused", p)
		}
		if wasRefused {
			refused++
		}
		tried++
		_ = os.RemoveAll(dir)
	}
	t.Logf("%d of %d used bytes tried: %d refused, %d opened whole", tried, used, refused, tried-refused)
	if tried < 20 {
		t.Fatalf("only %d positions tried within %v", tried, budget)
	}
}
