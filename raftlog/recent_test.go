package raftlog

import (
	"testing"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// TestRecentCacheIsBoundedAndASuffix: the cache of recent entries stays within maxRecentBytes and always
// ends at the last index, across appends, an overwrite, a compaction past it and a snapshot.
func TestRecentCacheIsBoundedAndASuffix(t *testing.T) {
	s := mustOpen(t, t.TempDir())
	next := saveEntries(t, s, 100, 4, 64<<10, check) // 6.4 MiB of entries in batches of 4
	if s.st.recentCost() > maxRecentBytes || len(s.st.recent) == 0 {
		t.Fatalf("cache costs %d bytes in %d entries, bound %d", s.st.recentCost(), len(s.st.recent), maxRecentBytes)
	}
	// Overwrite the last ten entries under a new term.
	if err := s.Save(nil, []*raftpb.Entry{{Index: new(next - 10), Term: new(uint64(2))}}, nil); err != nil {
		t.Fatal(err)
	}
	check(t, s)
	if got, _ := s.Entries(next-10, next-9, 1<<30); got[0].GetTerm() != 2 {
		t.Fatalf("entry %d after the overwrite has term %d", next-10, got[0].GetTerm())
	}
	if err := s.Compact(next - 12); err != nil {
		t.Fatal(err)
	}
	check(t, s)
	if err := s.ApplySnapshot(&raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(next + 5), Term: new(uint64(3))}}); err != nil {
		t.Fatal(err)
	}
	if len(s.st.recent) != 0 {
		t.Fatalf("cache holds %d entries after a snapshot replaced the log", len(s.st.recent))
	}
}

// TestRecentCacheCountsWhatSmallEntriesCost: entries about an acquire's size are bounded by what they
// cost in memory, not by their proto sizes alone (which let 4 MiB of them take 2–3× that).
func TestRecentCacheCountsWhatSmallEntriesCost(t *testing.T) {
	s := mustOpen(t, t.TempDir())
	saveEntries(t, s, 100, 1000, 100, nil) // 100,000 entries of ~105 bytes: 10.5 MB of proto sizes
	check(t, s)
	if cost, want := s.st.recentCost(), maxRecentBytes; cost > want {
		t.Fatalf("cache costs %d bytes, bound %d", cost, want)
	}
	if n, most := len(s.st.recent), maxRecentBytes/(100+recentEntryOverhead); n > most {
		t.Fatalf("cache holds %d entries of ~105 bytes, want at most %d", n, most)
	}
}

// saveEntries saves batches batches of n entries of size bytes of data each, from index 1 on, calling
// after (if not nil) after each save; it returns the next index.
func saveEntries(t *testing.T, s *Storage, batches, n, size int, after func(*testing.T, *Storage)) uint64 {
	t.Helper()
	data := make([]byte, size)
	next := uint64(1)
	for range batches {
		ents := make([]*raftpb.Entry, n)
		for k := range ents {
			ents[k] = &raftpb.Entry{Index: new(next), Term: new(uint64(1)), Data: data}
			next++
		}
		if err := s.Save(nil, ents, nil); err != nil {
			t.Fatal(err)
		}
		if after != nil {
			after(t, s)
		}
	}
	return next
}

// check verifies that the cache is a suffix of the log ending at its last index, with its size right.
func check(t *testing.T, s *Storage) {
	t.Helper()
	st := &s.st
	for k, e := range st.recent {
		if want := st.recentFirst() + uint64(k); e.GetIndex() != want {
			t.Fatalf("cache entry %d has index %d, want %d (last %d)", k, e.GetIndex(), want, st.last)
		}
	}
	if len(st.recent) > 0 && st.recent[len(st.recent)-1].GetIndex() != st.last {
		t.Fatalf("cache ends at %d, log at %d", st.recent[len(st.recent)-1].GetIndex(), st.last)
	}
	got := 0
	for k, e := range st.recent {
		if size := proto.Size(e); k >= len(st.recentSizes) || int(st.recentSizes[k]) != size {
			t.Fatalf("cache entry %d is %d bytes, recorded as %v", k, size, st.recentSizes[k:min(k+1, len(st.recentSizes))])
		}
		got += proto.Size(e)
	}
	if got != st.recentBytes || len(st.recentSizes) != len(st.recent) {
		t.Fatalf("cache counts %d bytes, holds %d (%d sizes for %d entries)", st.recentBytes, got, len(st.recentSizes), len(st.recent))
	}
}
