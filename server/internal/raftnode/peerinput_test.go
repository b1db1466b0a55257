package raftnode

import (
	"testing"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/leased/leased/server/internal/clock"
)

// Messages the random peer stream found that stop a node in raft itself, each now dropped.
func TestPeerChecksRefuseWhatRaftPanicsOn(t *testing.T) {
	view := PeerView{
		Self:       1,
		IsMember:   func(id uint64) bool { return id >= 1 && id <= 3 },
		LastIndex:  func() uint64 { return 10 },
		AcceptTerm: NewTermGuard(clock.NewManual(), 5).AcceptTerm,
	}
	msg := func(typ raftpb.MessageType, term uint64, ctx []byte) *raftpb.Message {
		return &raftpb.Message{Type: typ.Enum(), From: new(uint64(2)), To: new(uint64(1)), Term: &term, Commit: new(uint64(0)), Context: ctx}
	}
	for _, c := range []struct {
		name string
		m    *raftpb.Message
		want string
	}{
		{"a forwarded read index", msg(raftpb.MsgReadIndex, 0, nil), ""},
		{"a read index with a term (a follower forwarding it panics)", msg(raftpb.MsgReadIndex, 5, nil), dropMalformed},
		{"a heartbeat with a read-index round", msg(raftpb.MsgHeartbeat, 5, make([]byte, 8)), ""},
		{"a heartbeat answer with a 3-byte context (the leader reads 8)", msg(raftpb.MsgHeartbeatResp, 5, make([]byte, 3)), dropMalformed},
		{"a heartbeat with a 9-byte context", msg(raftpb.MsgHeartbeat, 5, make([]byte, 9)), dropMalformed},
		{"a heartbeat 2^32 + 1 ahead", msg(raftpb.MsgHeartbeat, 5+1<<32+1, nil), dropTerm},
	} {
		if got := CheckPeerMessage(c.m, view); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}
