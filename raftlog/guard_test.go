package raftlog

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// lose truncates dir's newest segment after its first keep records (base
// record included), as a disk that lost the writes after them would leave
// it, and returns the segment's path.
func lose(t *testing.T, dir string, keep int) string {
	t.Helper()
	segs, _ := filepath.Glob(filepath.Join(dir, walDirName, "*.wal"))
	path := segs[len(segs)-1]
	img, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	offs := recordOffsets(img)
	if keep >= len(offs)-1 {
		t.Fatalf("segment has %d records, cannot keep %d and lose some", len(offs)-1, keep)
	}
	if err := os.Truncate(path, int64(offs[keep])); err != nil {
		t.Fatal(err)
	}
	return path
}

func expectShortLog(t *testing.T, dir, what string) {
	t.Helper()
	before := readLogFiles(t, dir)
	s, err := Open(dir, testID)
	if err == nil {
		last, _ := s.LastIndex()
		_ = s.Close()
		t.Fatalf("%s: Open succeeded with a log ending at %d; want ErrShortLog", what, last)
	}
	if !errors.Is(err, ErrShortLog) || !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), filepath.Join(dir, ackFileName)) {
		t.Fatalf("%s: Open: %v; want ErrShortLog and ErrCorrupt naming the ack file", what, err)
	}
	if after := readLogFiles(t, dir); !equalFiles(before, after) {
		t.Fatalf("%s: Open changed the files it refused", what)
	}
}

// TestLostWritesAreRefused: a WAL that ends earlier than the ack file's
// mark (its last records lost, cleanly, at a record boundary, so the WAL
// alone looks whole) must be refused, naming the ack file, and left as it
// was: after a clean stop, and after a crash, whatever the records lost
// held (entries, a term change, a vote).
func TestLostWritesAreRefused(t *testing.T) {
	t.Run("after a clean stop", func(t *testing.T) {
		dir := t.TempDir()
		s := mustOpen(t, dir)
		for i := uint64(1); i <= 40; i += 10 {
			if err := s.Save(hardState(1, 1, i), entries(i, i+10, 1), nil); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		lose(t, dir, 4) // base, reset, two of the four Saves
		expectShortLog(t, dir, "last two Saves lost after a clean stop")
	})
	t.Run("a vote lost after a crash", func(t *testing.T) {
		dir := t.TempDir()
		s := mustOpen(t, dir)
		if err := s.Save(hardState(1, 1, 10), entries(1, 11, 1), nil); err != nil {
			t.Fatal(err)
		}
		if err := s.Save(hardState(2, 3, 10), nil, nil); err != nil { // votes for 3 in term 2
			t.Fatal(err)
		}
		crashed := copyLog(t, dir) // what a SIGKILL now leaves
		lose(t, crashed, 3)        // the vote's batch
		expectShortLog(t, crashed, "a vote lost")
	})
	t.Run("entries lost after a crash", func(t *testing.T) {
		dir := t.TempDir()
		s := mustOpen(t, dir)
		if err := s.Save(hardState(1, 1, 10), entries(1, 11, 1), nil); err != nil {
			t.Fatal(err)
		}
		if err := s.Save(hardState(2, 0, 10), entries(11, 21, 2), nil); err != nil {
			t.Fatal(err)
		}
		if err := s.Save(hardState(2, 0, 25), entries(21, 26, 2), nil); err != nil {
			t.Fatal(err)
		}
		crashed := copyLog(t, dir)
		lose(t, crashed, 3) // the term change's entries and everything after
		expectShortLog(t, crashed, "entries before the last term change lost")

		// Only the last Save lost: every Save that appends records the mark.
		crashed = copyLog(t, dir)
		lose(t, crashed, 4)
		expectShortLog(t, crashed, "the last Save's entries lost")
	})
}

// TestLegitimateShorterLogsOpen: the mark never refuses what raft itself
// does: a suffix overwritten by a new leader (the log ends before the
// marked entry, which replay passed through), a crash right after, or a
// snapshot installed over a longer log.
func TestLegitimateShorterLogsOpen(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir)
	if err := s.Save(hardState(1, 1, 5), entries(1, 21, 1), nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Save(hardState(2, 0, 5), nil, nil); err != nil { // marks entry 20 of term 1
		t.Fatal(err)
	}
	if err := s.Save(hardState(2, 0, 5), entries(8, 10, 2), nil); err != nil { // overwrites 8..20
		t.Fatal(err)
	}
	checkLog(t, mustOpen(t, copyLog(t, dir)), 1, 9, hardState(2, 0, 5))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	checkLog(t, mustOpen(t, dir), 1, 9, hardState(2, 0, 5))
}

// TestTermChangeDoesNotWaitForASnapshotWrite: while CreateSnapshot writes
// raft.db (held here), a Save that changes the term and vote must return
// without waiting for it (an election must not wait seconds on a large
// snapshot), having recorded its mark: losing that vote is refused.
func TestTermChangeDoesNotWaitForASnapshotWrite(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir)
	if err := s.Save(hardState(1, 1, 10), entries(1, 11, 1), nil); err != nil {
		t.Fatal(err)
	}
	started, release := make(chan struct{}), make(chan struct{})
	commitHook = func(step string) error {
		if step == "snapshot writing" {
			close(started)
			<-release
		}
		return nil
	}
	t.Cleanup(func() { commitHook = func(string) error { return nil } })
	snapped := make(chan error, 1)
	go func() {
		_, err := s.CreateSnapshot(5, nil, []byte("state at 5"))
		snapped <- err
	}()
	<-started
	saved := make(chan error, 1)
	go func() { saved <- s.Save(hardState(2, 3, 10), nil, nil) }()
	select {
	case err := <-saved:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		close(release)
		<-snapped
		t.Fatal("a Save changing the term waited for the snapshot's raft.db write")
	}
	close(release)
	if err := <-snapped; err != nil {
		t.Fatal(err)
	}
	crashed := copyLog(t, dir)
	lose(t, crashed, 3) // the vote's batch
	expectShortLog(t, crashed, "a vote lost while a snapshot was written")
}
