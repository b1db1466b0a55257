package raftlog

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// testdata/format1/raft.db was written by the format 1 code (commit
// c8d5bad) running formatOneHistory's operations; replaying them on a
// MemoryStorage gives the log it must open as.
func formatOneHistory(t *testing.T, ms *raft.MemoryStorage) {
	t.Helper()
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(ms.SetHardState(hardState(1, 1, 0)))
	must(ms.Append(entries(1, 201, 1)))
	must(ms.SetHardState(hardState(2, 2, 150)))
	must(ms.Append(entries(180, 260, 2)))
	_, err := ms.CreateSnapshot(120, &raftpb.ConfState{Voters: []uint64{1, 2, 3}}, []byte("state at 120"))
	must(err)
	must(ms.Compact(100))
	must(ms.SetHardState(hardState(3, 1, 200)))
	must(ms.Append(entries(240, 300, 3)))
}

// formatOneDir is a new data dir holding testdata/format1's raft.db, made by the bbolt-only code.
func formatOneDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	img, err := os.ReadFile(filepath.Join("testdata", "format1", fileName))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, fileName), img, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestFormatOneDirMigratesToTheSameLog opens a data dir made by the old
// code path: it must migrate to the WAL once, answer exactly as the old
// log did, stay that way across reopens, and accept writes.
func TestFormatOneDirMigratesToTheSameLog(t *testing.T) {
	dir := formatOneDir(t)
	ms := raft.NewMemoryStorage()
	formatOneHistory(t, ms)
	for round := range 2 {
		s := mustOpen(t, dir)
		assertSameLog(t, s, ms)
		if f := readFormat(t, s); f != formatVersion {
			t.Fatalf("round %d: format %d after Open, want %d", round, f, formatVersion)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	s := mustOpen(t, dir)
	if err := s.Save(hardState(3, 1, 250), entries(300, 310, 3), nil); err != nil {
		t.Fatal(err)
	}
	if err := ms.Append(entries(300, 310, 3)); err != nil {
		t.Fatal(err)
	}
	_ = ms.SetHardState(hardState(3, 1, 250))
	assertSameLog(t, s, ms)
}

// TestInterruptedMigrationStartsOver leaves what a crash between writing
// the new WAL and the bbolt commit leaves (a complete wal/ beside a format
// 1 raft.db, plus a stray temporary segment) and checks Open redoes it.
func TestInterruptedMigrationStartsOver(t *testing.T) {
	dir := formatOneDir(t)
	walDir := filepath.Join(dir, walDirName)
	if err := os.MkdirAll(walDir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{segmentName(1), segmentName(2) + ".tmp"} {
		if err := os.WriteFile(filepath.Join(walDir, name), []byte("half a migration"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ms := raft.NewMemoryStorage()
	formatOneHistory(t, ms)
	assertSameLog(t, mustOpen(t, dir), ms)
}

func TestNewerFormatIsAClearError(t *testing.T) {
	dir := t.TempDir()
	writeBolt(func(tx *bolt.Tx) error {
		if err := initLayout(tx, testID, walFrom{}); err != nil {
			return err
		}
		return putFormat(tx.Bucket(bucketMeta), formatVersion+1)
	})(t, filepath.Join(dir, fileName))
	_, err := Open(dir, testID)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "newer than this build knows") {
		t.Fatalf("Open of a format %d file: %v", formatVersion+1, err)
	}
}

func readFormat(t *testing.T, s *Storage) uint32 {
	t.Helper()
	var f uint32
	if err := s.db.View(func(tx *bolt.Tx) error {
		f = binary.BigEndian.Uint32(tx.Bucket(bucketMeta).Get(keyFormat))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return f
}

// assertSameLog compares every read method of s with ms.
func assertSameLog(t *testing.T, s *Storage, ms *raft.MemoryStorage) {
	t.Helper()
	first, _ := s.FirstIndex()
	last, _ := s.LastIndex()
	wantFirst, _ := ms.FirstIndex()
	wantLast, _ := ms.LastIndex()
	if first != wantFirst || last != wantLast {
		t.Fatalf("log [%d, %d], want [%d, %d]", first, last, wantFirst, wantLast)
	}
	for i := first - 1; i <= last; i++ {
		got, _ := s.Term(i)
		want, _ := ms.Term(i)
		if got != want {
			t.Fatalf("Term(%d) = %d, want %d", i, got, want)
		}
	}
	got, err := s.Entries(first, last+1, 1<<40)
	want, _ := ms.Entries(first, last+1, 1<<40)
	if err != nil || !equalEntries(got, want) {
		t.Fatalf("Entries: %d entries, %v; want %d", len(got), err, len(want))
	}
	hs, cs, _ := s.InitialState()
	whs, wcs, _ := ms.InitialState()
	if hs.String() != whs.String() || cs.String() != wcs.String() {
		t.Fatalf("InitialState = %v, %v; want %v, %v", hs, cs, whs, wcs)
	}
	snap, _ := s.Snapshot()
	wsnap, _ := ms.Snapshot()
	if !equalSnap(snap, wsnap) {
		t.Fatalf("Snapshot = %v, want %v", snap, wsnap)
	}
}

// initV1Layout writes an empty format 1 file, as the format 1 code did.
func initV1Layout(tx *bolt.Tx, id Identity) error {
	meta, err := tx.CreateBucket(bucketMeta)
	if err != nil {
		return err
	}
	for _, name := range [][]byte{bucketSnapshot, bucketEntries} {
		if _, err := tx.CreateBucket(name); err != nil {
			return err
		}
	}
	if err := putFormat(meta, formatV1); err != nil {
		return err
	}
	if err := meta.Put(keyIdentity, id.encode()); err != nil {
		return err
	}
	if err := putSnapshot(tx, raftpb.EnsureSnapshotMetadata(nil), nil); err != nil {
		return err
	}
	return putV1Entry(tx, &raftpb.Entry{Index: new(uint64), Term: new(uint64)})
}

func putV1Entry(tx *bolt.Tx, e *raftpb.Entry) error {
	v, err := sealProto(e)
	if err != nil {
		return err
	}
	return tx.Bucket(bucketEntries).Put(indexKey(e.GetIndex()), v)
}
