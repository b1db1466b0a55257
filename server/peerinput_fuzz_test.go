package server

import (
	"fmt"
	"io"
	"log"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server/internal/raftnode"
)

// FuzzPeerMessage hands authenticated-but-garbage messages — every field of a raftpb.Message chosen by
// the fuzzer, sent by a real member — to a real raft node, follower or leader, through raftnode.CheckPeerMessage:
// whatever the checks let through, raft must take without panicking. This is how the checks were found
// (a heartbeat past the log, a term of 0, entries out of order, a snapshot raft cannot restore).
func FuzzPeerMessage(f *testing.F) {
	f.Add(false, uint8(raftpb.MsgHeartbeat), uint8(0), uint64(3), uint64(0), uint64(0), uint64(1<<40), false, uint64(0), uint8(0), uint64(0), uint64(0), uint8(0))
	f.Add(false, uint8(raftpb.MsgHeartbeat), uint8(0), ^uint64(0), uint64(0), uint64(0), uint64(0), false, uint64(0), uint8(0), uint64(0), uint64(0), uint8(0))
	f.Add(false, uint8(raftpb.MsgApp), uint8(0), uint64(3), uint64(1), uint64(2), uint64(9), false, uint64(0), uint8(3), uint64(0), uint64(0), uint8(0))
	f.Add(true, uint8(raftpb.MsgAppResp), uint8(1), uint64(3), uint64(0), uint64(1<<50), uint64(0), false, uint64(0), uint8(0), uint64(0), uint64(0), uint8(0))
	f.Add(true, uint8(raftpb.MsgAppResp), uint8(1), uint64(3), uint64(7), uint64(3), uint64(0), true, uint64(1<<50), uint8(0), uint64(0), uint64(0), uint8(0))
	f.Add(false, uint8(raftpb.MsgSnap), uint8(0), uint64(3), uint64(0), uint64(0), uint64(0), false, uint64(0), uint8(0), uint64(20), uint64(3), uint8(0b011))
	f.Add(false, uint8(raftpb.MsgVote), uint8(1), uint64(9), uint64(5), uint64(99), uint64(0), false, uint64(0), uint8(0), uint64(0), uint64(0), uint8(0))
	f.Fuzz(func(t *testing.T, leader bool, typ, sender uint8, term, logTerm, index, commit uint64, reject bool,
		rejectHint uint64, entries uint8, snapIndex, snapTerm uint64, voters uint8) {
		rn, storage := fuzzNode(t, leader)
		from := []uint64{2, 3, 9}[int(sender)%3]
		m := &raftpb.Message{
			Type: raftpb.MessageType(int32(typ) % 24).Enum(), From: &from, To: new(uint64(1)),
			Term: &term, LogTerm: &logTerm, Index: &index, Commit: &commit, Reject: &reject, RejectHint: &rejectHint,
		}
		// Entries: mostly consistent after (Index, LogTerm), with the fuzzer's bits bending indexes and terms.
		for i := range uint64(entries % 8) {
			e := &raftpb.Entry{Index: new(index + 1 + i), Term: new(max(logTerm, term))}
			if entries&0x80 != 0 && i == 1 {
				e.Index = new(index + 5) // a gap
			}
			if entries&0x40 != 0 {
				e.Term = new(logTerm + i*3) // terms past the leader's
			}
			m.Entries = append(m.Entries, e)
		}
		if m.GetType() == raftpb.MsgSnap || snapIndex != 0 {
			cs := &raftpb.ConfState{}
			for bit, id := range []uint64{1, 2, 3, 9} {
				if voters&(1<<bit) != 0 {
					cs.Voters = append(cs.Voters, id)
				}
				if voters&(1<<(bit+4)) != 0 {
					cs.Learners = append(cs.Learners, id)
				}
			}
			m.Snapshot = &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: &snapIndex, Term: &snapTerm, ConfState: cs},
				Data: fuzzSnapshotData(t, snapIndex, cs)}
		}
		view := raftnode.PeerView{
			Self:       1,
			AcceptTerm: raftnode.NewTermGuard(NewManualClock(), rn.Status().GetTerm()).AcceptTerm,
			IsMember:   func(id uint64) bool { return id >= 1 && id <= 3 },
			LastIndex: func() uint64 {
				last, _ := storage.LastIndex()
				return last
			},
			CheckSnapshot: checkSnapshotData,
		}
		if raftnode.CheckPeerMessage(m, view) != "" {
			return
		}
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("raft panicked on a message the checks let through: %v\n%v", r, m)
			}
		}()
		_ = rn.Step(m)
		drainRaft(t, rn, storage)
	})
}

// fuzzNode is raft node 1 of voters {1, 2, 3}, configured as raftnode.Node does, with entries 1..5 of term 1
// (3 committed) at term 2: a follower, or the leader of term 3.
func fuzzNode(t *testing.T, leader bool) (*raft.RawNode, *raft.MemoryStorage) {
	t.Helper()
	storage := raft.NewMemoryStorage()
	voters := &raftpb.ConfState{Voters: []uint64{1, 2, 3}}
	if err := storage.ApplySnapshot(&raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(0)), Term: new(uint64(0)), ConfState: voters}}); err != nil {
		t.Fatal(err)
	}
	var ents []*raftpb.Entry
	for i := range uint64(5) {
		ents = append(ents, &raftpb.Entry{Index: new(i + 1), Term: new(uint64(1)), Type: raftpb.EntryNormal.Enum()})
	}
	if err := storage.Append(ents); err != nil {
		t.Fatal(err)
	}
	if err := storage.SetHardState(&raftpb.HardState{Term: new(uint64(2)), Commit: new(uint64(3)), Vote: new(uint64(0))}); err != nil {
		t.Fatal(err)
	}
	rn, err := raft.NewRawNode(&raft.Config{
		ID: 1, ElectionTick: 10, HeartbeatTick: 1, Storage: storage, Applied: 0,
		MaxSizePerMsg: 1 << 20, MaxInflightMsgs: 256, MaxUncommittedEntriesSize: 64 << 20,
		CheckQuorum: true, PreVote: true, ReadOnlyOption: raft.ReadOnlySafe, DisableProposalForwarding: true,
		Logger: &raft.DefaultLogger{Logger: log.New(io.Discard, "", 0)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if leader {
		if err := rn.Campaign(); err != nil {
			t.Fatal(err)
		}
		drainRaft(t, rn, storage)
		for _, typ := range []raftpb.MessageType{raftpb.MsgPreVoteResp, raftpb.MsgVoteResp} {
			term := rn.Status().GetTerm()
			if typ == raftpb.MsgPreVoteResp {
				term++
			}
			if err := rn.Step(&raftpb.Message{Type: typ.Enum(), From: new(uint64(2)), To: new(uint64(1)), Term: &term}); err != nil {
				t.Fatal(err)
			}
			drainRaft(t, rn, storage)
		}
		if rn.Status().RaftState != raft.StateLeader {
			t.Fatalf("node 1 did not become leader: %v", rn.Status().RaftState)
		}
	}
	return rn, storage
}

// drainRaft persists and acknowledges what raft asks, as the Ready loop does (bounded: a fuzz case must end).
func drainRaft(t *testing.T, rn *raft.RawNode, storage *raft.MemoryStorage) {
	t.Helper()
	for range 4 {
		if !rn.HasReady() {
			return
		}
		rd := rn.Ready()
		if !raft.IsEmptySnap(rd.Snapshot) {
			if err := storage.ApplySnapshot(rd.Snapshot); err != nil {
				panic(fmt.Sprintf("apply snapshot: %v", err))
			}
		}
		if !raft.IsEmptyHardState(rd.HardState) {
			if err := storage.SetHardState(rd.HardState); err != nil {
				panic(err)
			}
		}
		if err := storage.Append(rd.Entries); err != nil {
			panic(fmt.Sprintf("append: %v", err))
		}
		rn.Advance(rd)
	}
}

// fuzzSnapshotData is the state a snapshot at index with configuration cs carries: its members, so that
// the data checks pass and raft's side of the snapshot is what the fuzzer explores.
func fuzzSnapshotData(t *testing.T, index uint64, cs *raftpb.ConfState) []byte {
	t.Helper()
	var members []*leasepb.Member
	for _, id := range cs.GetVoters() {
		members = append(members, &leasepb.Member{Id: id, Name: fmt.Sprint(id)})
	}
	for _, id := range cs.GetLearners() {
		members = append(members, &leasepb.Member{Id: id, Name: fmt.Sprint(id), IsLearner: true})
	}
	sm := fsm.New()
	if err := sm.Rebase(index, members); err != nil {
		t.Fatal(err)
	}
	data, err := sm.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	return data
}
