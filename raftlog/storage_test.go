package raftlog

import (
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// compactedLog returns a Storage holding entries 4..8 (terms 1,1,2,2,3) with
// 3 (term 1) as the compacted offset.
func compactedLog(t *testing.T) *Storage {
	t.Helper()
	s := mustOpen(t, t.TempDir())
	ents := append(entries(1, 6, 1), entry(6, 2), entry(7, 2), entry(8, 3))
	if err := s.Save(hardState(3, 1, 8), ents, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Compact(3); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestEntriesEdgeCases(t *testing.T) {
	s := compactedLog(t)
	size := uint64(proto.Size(entry(4, 1)))
	tests := []struct {
		name     string
		lo, hi   uint64
		maxSize  uint64
		wantLo   uint64
		wantN    int
		wantErr  error
		wantWrap bool
	}{
		{"at the offset is compacted", 3, 5, math.MaxUint64, 0, 0, raft.ErrCompacted, false},
		{"below the offset is compacted", 1, 5, math.MaxUint64, 0, 0, raft.ErrCompacted, false},
		{"whole log", 4, 9, math.MaxUint64, 4, 5, nil, false},
		{"empty range", 5, 5, math.MaxUint64, 5, 0, nil, false},
		{"maxSize 0 still returns one entry", 4, 9, 0, 4, 1, nil, false},
		{"maxSize fits exactly two", 4, 9, 2 * size, 4, 2, nil, false},
		{"hi past last+1", 4, 10, math.MaxUint64, 0, 0, raft.ErrUnavailable, true},
		{"lo above hi", 6, 5, math.MaxUint64, 0, 0, ErrOutOfRange, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := s.Entries(tt.lo, tt.hi, tt.maxSize)
			if !sameErr(err, tt.wantErr) || (err != nil && !tt.wantWrap && err != tt.wantErr) {
				t.Fatalf("Entries(%d, %d, %d) error %v, want %v", tt.lo, tt.hi, tt.maxSize, err, tt.wantErr)
			}
			if len(got) != tt.wantN {
				t.Fatalf("got %d entries, want %d", len(got), tt.wantN)
			}
			for k, e := range got {
				if e.GetIndex() != tt.wantLo+uint64(k) {
					t.Fatalf("entry %d has index %d", k, e.GetIndex())
				}
			}
		})
	}
}

func TestEntriesOnlyDummyIsUnavailable(t *testing.T) {
	s := mustOpen(t, t.TempDir())
	if _, err := s.Entries(1, 1, math.MaxUint64); err != raft.ErrUnavailable {
		t.Fatalf("Entries on an empty log: %v, want bare raft.ErrUnavailable", err)
	}
}

// TestEntriesResultCanBeAppendedTo: raft appends its unstable entries to what Entries returns; that must
// not write into the storage's cache of recent entries. (The entries themselves are shared and read-only,
// as MemoryStorage's are.)
func TestEntriesResultCanBeAppendedTo(t *testing.T) {
	s := compactedLog(t)
	for _, fromDisk := range []bool{false, true} {
		if fromDisk {
			// Reopened, the cache starts empty: the entries come from the WAL.
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = mustOpen(t, filepath.Dir(s.Path()))
		}
		got, _ := s.Entries(4, 6, math.MaxUint64)
		_ = append(got, entry(99, 9))
		again, _ := s.Entries(4, 7, math.MaxUint64)
		if len(again) != 3 || again[2].GetIndex() != 6 || again[2].GetTerm() == 9 {
			t.Fatalf("appending to a returned slice changed the storage (from disk: %v): %v", fromDisk, again)
		}
	}
}

func TestTermEdgeCases(t *testing.T) {
	s := compactedLog(t)
	tests := []struct {
		i       uint64
		want    uint64
		wantErr error
	}{
		{2, 0, raft.ErrCompacted},
		{3, 1, nil}, // the dummy's term is kept
		{5, 1, nil},
		{6, 2, nil},
		{8, 3, nil},
		{9, 0, raft.ErrUnavailable},
	}
	for _, tt := range tests {
		got, err := s.Term(tt.i)
		if got != tt.want || err != tt.wantErr {
			t.Errorf("Term(%d) = %d, %v; want %d, %v", tt.i, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestCompactEdgeCases(t *testing.T) {
	s := compactedLog(t)
	if err := s.Compact(3); err != raft.ErrCompacted {
		t.Errorf("Compact(offset) = %v, want bare raft.ErrCompacted", err)
	}
	if err := s.Compact(9); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("Compact(last+1) = %v, want ErrOutOfRange", err)
	}
	if err := s.Compact(8); err != nil {
		t.Fatalf("Compact(last) = %v", err)
	}
	first, _ := s.FirstIndex()
	last, _ := s.LastIndex()
	if term, _ := s.Term(8); first != 9 || last != 8 || term != 3 {
		t.Fatalf("after Compact(last): first %d last %d term(8) %d; want 9, 8, 3", first, last, term)
	}
}

func TestCreateSnapshotEdgeCases(t *testing.T) {
	s := compactedLog(t)
	if _, err := s.CreateSnapshot(2, nil, nil); !errors.Is(err, raft.ErrCompacted) {
		t.Errorf("CreateSnapshot below the offset = %v, want ErrCompacted", err)
	}
	if _, err := s.CreateSnapshot(9, nil, nil); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("CreateSnapshot past last = %v, want ErrOutOfRange", err)
	}
	snap, err := s.CreateSnapshot(6, &raftpb.ConfState{Voters: []uint64{1}}, []byte("state"))
	if err != nil || snap.GetMetadata().GetTerm() != 2 {
		t.Fatalf("CreateSnapshot(6) = %v, %v; want term 2", snap, err)
	}
	if _, err := s.CreateSnapshot(6, nil, nil); err != raft.ErrSnapOutOfDate {
		t.Errorf("CreateSnapshot at the same index = %v, want bare raft.ErrSnapOutOfDate", err)
	}
}

// TestFailedSaveChangesNothing checks atomicity: a Save whose entries leave
// a gap must not store its HardState or its snapshot either.
func TestFailedSaveChangesNothing(t *testing.T) {
	s := compactedLog(t)
	snap := &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(20)), Term: new(uint64(5))}}
	for name, ents := range map[string][]*raftpb.Entry{
		"gap after the last index": entries(30, 32, 5),
		"entries not consecutive":  {entry(21, 5), entry(23, 5)},
	} {
		if err := s.Save(hardState(7, 2, 8), ents, snap); !errors.Is(err, ErrOutOfRange) {
			t.Fatalf("%s: Save = %v, want ErrOutOfRange", name, err)
		}
	}
	hs, _, _ := s.InitialState()
	first, _ := s.FirstIndex()
	last, _ := s.LastIndex()
	got, _ := s.Snapshot()
	if hs.GetTerm() != 3 || first != 4 || last != 8 || got.GetMetadata().GetIndex() != 0 {
		t.Fatalf("after failed Saves: hs %v first %d last %d snapshot %d", hs, first, last, got.GetMetadata().GetIndex())
	}
}

func TestSaveReplacesTheOverlappedSuffixDurably(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir)
	if err := s.Save(nil, entries(1, 11, 1), nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Save(nil, entries(5, 7, 2), nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, dir)
	last, _ := s.LastIndex()
	t5, _ := s.Term(5)
	t4, _ := s.Term(4)
	if last != 6 || t5 != 2 || t4 != 1 {
		t.Fatalf("after overlapping Save and reopen: last %d, term(4) %d, term(5) %d; want 6, 1, 2", last, t4, t5)
	}
}

func TestMethodsAfterCloseReturnErrClosed(t *testing.T) {
	s := mustOpen(t, t.TempDir())
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close = %v, want nil", err)
	}
	_, _, e1 := s.InitialState()
	_, e2 := s.Entries(1, 2, 0)
	_, e3 := s.Term(0)
	_, e4 := s.LastIndex()
	_, e5 := s.FirstIndex()
	_, e6 := s.Snapshot()
	e7 := s.Save(hardState(1, 1, 0), nil, nil)
	e8 := s.Compact(1)
	_, e9 := s.CreateSnapshot(1, nil, nil)
	e10 := s.ApplySnapshot(&raftpb.Snapshot{})
	for i, err := range []error{e1, e2, e3, e4, e5, e6, e7, e8, e9, e10} {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("call %d after Close: %v, want ErrClosed", i+1, err)
		}
	}
}

// TestCreateSnapshotDoesNotHoldUpAppends holds CreateSnapshot inside its raft.db write and checks that
// Save, Entries, Term and Snapshot all answer meanwhile (Snapshot with the previous snapshot), and that
// the snapshot is the stored one, across a reopen, once the write finishes; a crash during the write
// leaves the log without it.
func TestCreateSnapshotDoesNotHoldUpAppends(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir)
	if err := s.Save(hardState(1, 1, 10), entries(1, 11, 1), nil); err != nil {
		t.Fatal(err)
	}
	writing, release := make(chan struct{}), make(chan struct{})
	commitHook = func(step string) error {
		if step == "snapshot writing" {
			close(writing)
			<-release
		}
		return nil
	}
	t.Cleanup(func() { commitHook = func(string) error { return nil } })
	created := make(chan error, 1)
	go func() {
		_, err := s.CreateSnapshot(8, &raftpb.ConfState{Voters: []uint64{1}}, []byte("state at 8"))
		created <- err
	}()
	<-writing
	crashed := copyLog(t, dir) // what a crash in the middle of the write would leave
	others := make(chan error, 1)
	go func() {
		if err := s.Save(hardState(1, 1, 12), entries(11, 13, 1), nil); err != nil {
			others <- err
			return
		}
		if _, err := s.Entries(9, 13, 1<<20); err != nil {
			others <- err
			return
		}
		if _, err := s.Term(12); err != nil {
			others <- err
			return
		}
		snap, err := s.Snapshot()
		if err == nil && snap.GetMetadata().GetIndex() != 0 {
			err = fmt.Errorf("snapshot at %d while the one at 8 is still being written", snap.GetMetadata().GetIndex())
		}
		others <- err
	}()
	select {
	case err := <-others:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatal("Save, Entries, Term or Snapshot waited for CreateSnapshot's raft.db write")
	}
	close(release)
	if err := <-created; err != nil {
		t.Fatal(err)
	}
	commitHook = func(string) error { return nil }
	if snap, err := s.Snapshot(); err != nil || snap.GetMetadata().GetIndex() != 8 || string(snap.GetData()) != "state at 8" {
		t.Fatalf("Snapshot() = %v, %v; want the one at 8", snap, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, dir)
	if snap, err := s.Snapshot(); err != nil || snap.GetMetadata().GetIndex() != 8 || snap.GetMetadata().GetTerm() != 1 {
		t.Fatalf("after reopen Snapshot() = %v, %v; want index 8 term 1", snap, err)
	}
	checkLog(t, s, 1, 12, hardState(1, 1, 12))
	// A crash during the write leaves the log as it was, with no snapshot.
	c := mustOpen(t, crashed)
	if snap, err := c.Snapshot(); err != nil || snap.GetMetadata().GetIndex() != 0 {
		t.Fatalf("after a crash mid-write Snapshot() = %v, %v; want none", snap, err)
	}
	checkLog(t, c, 1, 10, hardState(1, 1, 10))
}
