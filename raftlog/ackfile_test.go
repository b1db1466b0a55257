package raftlog

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// TestAcknowledgedLastRecordThatReadsAsTornIsRefused: the last Save
// returned (raft may have acknowledged it), then its record was damaged in
// the one way Open takes for a torn write, its last sector zeroed. Open
// must refuse the log rather than start without that Save; a write that
// never returned (TestTornTailAtEveryByteReopensToThePreviousPrefix) is
// cut off as before.
func TestAcknowledgedLastRecordThatReadsAsTornIsRefused(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir)
	if err := s.Save(hardState(1, 1, 5), entries(1, 6, 1), nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Save(hardState(1, 1, 60), entries(6, 61, 1), nil); err != nil {
		t.Fatal(err)
	}
	segPath := s.wal.last().path
	crashed := copyLog(t, dir) // what a SIGKILL now leaves
	_ = s.Close()
	seg := filepath.Join(crashed, walDirName, filepath.Base(segPath))
	img, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	offs := recordOffsets(img)
	lastEnd := offs[len(offs)-1]
	clear(img[(lastEnd-1)/sectorSize*sectorSize : lastEnd])
	if err := os.WriteFile(seg, img, 0o600); err != nil {
		t.Fatal(err)
	}
	expectShortLog(t, crashed, "the last acknowledged record's last sector zeroed")
}

// TestAckFileDamage: a slot of the ack file damaged (a torn write of it, or
// a flipped byte) leaves the other, one Save older, and the log opens whole;
// both damaged, or the file missing or cut, is ErrCorrupt naming it, with
// every file left as it was.
func TestAckFileDamage(t *testing.T) {
	src := t.TempDir()
	s := mustOpen(t, src)
	for i := uint64(1); i <= 30; i += 10 {
		if err := s.Save(hardState(1, 1, i), entries(i, i+10, 1), nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	ack, err := os.ReadFile(filepath.Join(src, ackFileName))
	if err != nil {
		t.Fatal(err)
	}
	with := func(img []byte) string {
		dir := copyLog(t, src)
		path := filepath.Join(dir, ackFileName)
		if img == nil {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			return dir
		}
		if err := os.WriteFile(path, img, 0o600); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	for slot := range ackSlots {
		for _, off := range []int{0, 9, 40, ackSlotSize - 1} {
			bad := bytes.Clone(ack)
			bad[slot*ackSlotSize+off] ^= 0x10
			checkLog(t, mustOpen(t, with(bad)), 1, 30, hardState(1, 1, 21))
		}
	}
	refused := map[string][]byte{
		"both slots zeroed": make([]byte, len(ack)),
		"file cut":          ack[:ackSlotSize],
		"file missing":      nil,
	}
	for what, img := range refused {
		dir := with(img)
		path := filepath.Join(dir, ackFileName)
		if img == nil {
			s, err := Open(dir, testID)
			if err == nil {
				_ = s.Close()
				t.Fatalf("%s: Open succeeded", what)
			}
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), path) {
				t.Fatalf("%s: Open: %v; want ErrCorrupt naming %s", what, err, path)
			}
			continue
		}
		expectCorrupt(t, dir, path, what)
	}
}

// TestFormat2DirectoryIsMigrated: a data dir whose raft.db keeps the acked
// mark (format 2) is checked against that mark, then moved to the ack file;
// a format 2 log shorter than its mark is refused and left as it was.
func TestFormat2DirectoryIsMigrated(t *testing.T) {
	src := t.TempDir()
	s := mustOpen(t, src)
	if err := s.Save(hardState(1, 1, 10), entries(1, 21, 1), nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	legacy := func(m ackMark) string {
		dir := copyLog(t, src)
		if err := os.Remove(filepath.Join(dir, ackFileName)); err != nil {
			t.Fatal(err)
		}
		db, err := bolt.Open(filepath.Join(dir, fileName), 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		err = db.Update(func(tx *bolt.Tx) error {
			meta := tx.Bucket(bucketMeta)
			if err := meta.Put(keyAcked, seal(m.raw())); err != nil {
				return err
			}
			return putFormat(meta, formatLegacyMark)
		})
		if cerr := db.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatal(err)
		}
		return dir
	}

	dir := legacy(ackMark{at: point{20, 1}, term: 1, vote: 1})
	s = mustOpen(t, dir)
	checkLog(t, s, 1, 20, hardState(1, 1, 10))
	if err := s.Save(hardState(1, 1, 25), entries(21, 26, 1), nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(filepath.Join(dir, fileName), 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	ds, err := loadDB(db, filepath.Join(dir, fileName))
	_ = db.Close()
	if err != nil || ds.format != formatVersion || ds.mark != (ackMark{}) {
		t.Fatalf("after the upgrade raft.db has format %d and mark %+v (%v); want format %d and no mark", ds.format, ds.mark, err, formatVersion)
	}
	lose(t, dir, 3) // base, reset, the first Save: the one after the upgrade is lost
	expectShortLog(t, dir, "a Save after the upgrade lost")

	dir = legacy(ackMark{at: point{40, 1}, term: 1, vote: 1})
	before := readLogFiles(t, dir)
	if s, err := Open(dir, testID); err == nil || !errors.Is(err, ErrShortLog) {
		if s != nil {
			_ = s.Close()
		}
		t.Fatalf("format 2 log short of its mark: Open: %v; want ErrShortLog", err)
	}
	if !equalFiles(before, readLogFiles(t, dir)) {
		t.Fatal("Open changed a format 2 directory it refused")
	}
}
