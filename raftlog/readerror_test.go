package raftlog

import (
	"errors"
	"os"
	"strings"
	"testing"

	"go.etcd.io/raft/v3"
)

// TestEntriesReportsAFailedRead: when reading the WAL for entries no longer cached (a lagging follower's)
// fails, Entries returns that error, naming the segment: never raft.ErrUnavailable or raft.ErrCompacted,
// which raft takes for "no such entry" and "send a snapshot", nor fewer entries than asked as if the log
// ended there. (A regular file cannot be made to return EIO without a device-mapper target; a closed
// descriptor makes the same read fail.)
func TestEntriesReportsAFailedRead(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir)
	if err := s.Save(hardState(1, 1, 20), entries(1, 21, 1), nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, dir) // nothing cached: Entries reads the WAL
	seg := s.wal.last()
	if got, err := s.Entries(5, 15, 1<<20); err != nil || len(got) != 10 {
		t.Fatalf("Entries before the fault: %d entries, %v", len(got), err)
	}
	if err := seg.f.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := s.Entries(5, 15, 1<<20)
	if err == nil || err == raft.ErrUnavailable || err == raft.ErrCompacted || errors.Is(err, ErrCorrupt) {
		t.Fatalf("Entries after a failed read: %d entries, %v; want the read error", len(got), err)
	}
	if !errors.Is(err, os.ErrClosed) || !strings.Contains(err.Error(), seg.path) {
		t.Errorf("Entries error %q does not carry the read error and name %s", err, seg.path)
	}
	reopened, err := os.OpenFile(seg.path, os.O_RDWR, 0) // so that Close finds an open file
	if err != nil {
		t.Fatal(err)
	}
	seg.f = reopened
}
