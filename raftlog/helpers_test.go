package raftlog

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"

	"go.etcd.io/raft/v3/raftpb"
)

// testID is the identity most tests open with.
var testID = Identity{ClusterID: 0xc1, NodeID: 1}

// mustOpen opens dir or fails the test; the Storage is closed at cleanup.
func mustOpen(t testing.TB, dir string) *Storage {
	t.Helper()
	s, err := Open(dir, testID)
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// entry builds an entry whose payload is derived from its index and term,
// so a test can tell which write it came from.
func entry(i, term uint64) *raftpb.Entry {
	return &raftpb.Entry{Index: new(i), Term: new(term), Data: payload(i, term)}
}

func payload(i, term uint64) []byte {
	return []byte(fmt.Sprintf("entry %d term %d", i, term))
}

func entries(lo, hi, term uint64) []*raftpb.Entry {
	var ents []*raftpb.Entry
	for i := lo; i < hi; i++ {
		ents = append(ents, entry(i, term))
	}
	return ents
}

func hardState(term, vote, commit uint64) *raftpb.HardState {
	return &raftpb.HardState{Term: new(term), Vote: new(vote), Commit: new(commit)}
}

// sameErr reports whether two results carry the same error: both nil, or
// got wraps want.
func sameErr(got, want error) bool {
	if want == nil || got == nil {
		return got == want
	}
	return errors.Is(got, want)
}

// normSnap makes snapshots from either storage comparable: both sides get
// every optional field set, and nil vs empty data are the same.
func normSnap(s *raftpb.Snapshot) *raftpb.Snapshot {
	if s == nil {
		return nil
	}
	c := raftpb.EnsureSnapshot(proto.Clone(s).(*raftpb.Snapshot))
	if len(c.Data) == 0 {
		c.Data = nil
	}
	return c
}

func equalSnap(a, b *raftpb.Snapshot) bool {
	a, b = normSnap(a), normSnap(b)
	return proto.Equal(a.GetMetadata(), b.GetMetadata()) && bytes.Equal(a.GetData(), b.GetData())
}

func equalEntries(a, b []*raftpb.Entry) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !proto.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}
