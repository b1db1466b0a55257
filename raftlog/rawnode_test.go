package raftlog

import (
	"bytes"
	"fmt"
	"io"
	"log"
	"testing"

	"google.golang.org/protobuf/proto"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// TestRaftRunsOnStorageAndRestartsFromIt drives a single-node raft.RawNode
// whose only storage is a Storage: bootstrap, elect, commit proposals, take a
// snapshot and compact, then restart from the reopened file. raft panics on
// any Storage contract violation, and the restarted node must come back with
// its log and commit index.
func TestRaftRunsOnStorageAndRestartsFromIt(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir)
	rn := newRawNode(t, s)
	if err := rn.Bootstrap([]raft.Peer{{ID: 1}}); err != nil {
		t.Fatal(err)
	}
	var applied [][]byte
	drain(t, rn, s, &applied)
	if err := rn.Campaign(); err != nil {
		t.Fatal(err)
	}
	drain(t, rn, s, &applied)
	for i := range 50 {
		if err := rn.Propose([]byte(fmt.Sprintf("cmd %d", i))); err != nil {
			t.Fatal(err)
		}
		drain(t, rn, s, &applied)
		if i == 30 {
			snapshotAndCompact(t, rn, s)
		}
	}
	if len(applied) != 50 || !bytes.Equal(applied[49], []byte("cmd 49")) {
		t.Fatalf("applied %d commands, want 50", len(applied))
	}
	commit := rn.Status().GetCommit()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = mustOpen(t, dir)
	hs, _, _ := s.InitialState()
	last, _ := s.LastIndex()
	if hs.GetCommit() != commit || last != commit {
		t.Fatalf("reopened: commit %d, last %d; want %d", hs.GetCommit(), last, commit)
	}
	rn = newRawNode(t, s)
	if got := rn.Status().GetCommit(); got != commit {
		t.Fatalf("restarted node commit %d, want %d", got, commit)
	}
}

func newRawNode(t *testing.T, s *Storage) *raft.RawNode {
	t.Helper()
	rn, err := raft.NewRawNode(&raft.Config{
		ID: 1, ElectionTick: 10, HeartbeatTick: 1, Storage: s,
		MaxSizePerMsg: 1 << 20, MaxInflightMsgs: 256,
		Logger: &raft.DefaultLogger{Logger: log.New(io.Discard, "", 0)},
	})
	if err != nil {
		t.Fatal(err)
	}
	return rn
}

// drain runs the Ready loop until raft has nothing more to do.
func drain(t *testing.T, rn *raft.RawNode, s *Storage, applied *[][]byte) {
	t.Helper()
	for rn.HasReady() {
		rd := rn.Ready()
		if err := s.Save(rd.HardState, rd.Entries, rd.Snapshot); err != nil {
			t.Fatalf("Save: %v", err)
		}
		for _, e := range rd.CommittedEntries {
			switch {
			case e.GetType() == raftpb.EntryConfChange:
				var cc raftpb.ConfChange
				if err := proto.Unmarshal(e.GetData(), &cc); err != nil {
					t.Fatal(err)
				}
				rn.ApplyConfChange(&cc)
			case len(e.GetData()) > 0:
				*applied = append(*applied, e.GetData())
			}
		}
		rn.Advance(rd)
	}
}

func snapshotAndCompact(t *testing.T, rn *raft.RawNode, s *Storage) {
	t.Helper()
	applied := rn.Status().Applied
	cs := &raftpb.ConfState{Voters: []uint64{1}}
	if _, err := s.CreateSnapshot(applied, cs, []byte("fsm state")); err != nil {
		t.Fatal(err)
	}
	if err := s.Compact(applied - 5); err != nil {
		t.Fatal(err)
	}
}
