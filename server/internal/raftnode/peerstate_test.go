package raftnode

import (
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

func TestFitsRaftState(t *testing.T) {
	follower := raft.BasicStatus{HardState: &raftpb.HardState{Term: new(uint64(5))}, SoftState: raft.SoftState{Lead: 2, RaftState: raft.StateFollower}}
	noLeader := raft.BasicStatus{HardState: &raftpb.HardState{Term: new(uint64(5))}, SoftState: raft.SoftState{RaftState: raft.StateCandidate}}
	leader := raft.BasicStatus{HardState: &raftpb.HardState{Term: new(uint64(5))}, SoftState: raft.SoftState{Lead: 1, RaftState: raft.StateLeader}}
	msg := func(typ raftpb.MessageType, from, term uint64) *raftpb.Message {
		return &raftpb.Message{Type: typ.Enum(), From: &from, Term: &term}
	}
	for _, c := range []struct {
		name string
		st   raft.BasicStatus
		m    *raftpb.Message
		want bool
	}{
		{"a snapshot from the leader", follower, msg(raftpb.MsgSnap, 2, 5), true},
		{"a snapshot from another member", follower, msg(raftpb.MsgSnap, 3, 5), false},
		{"a snapshot from a term not reached", follower, msg(raftpb.MsgSnap, 2, 6), false},
		{"a snapshot to a node without a leader", noLeader, msg(raftpb.MsgSnap, 2, 5), false},
		{"a heartbeat from the leader", follower, msg(raftpb.MsgHeartbeat, 2, 5), true},
		{"a heartbeat from another member in the leader's term", follower, msg(raftpb.MsgHeartbeat, 3, 5), false},
		{"an append from another member in the leader's term", follower, msg(raftpb.MsgApp, 3, 5), false},
		{"an append to the leader itself", leader, msg(raftpb.MsgApp, 3, 5), false},
		{"an append from a new term's leader", follower, msg(raftpb.MsgApp, 3, 6), true},
		{"an append to a node that knows no leader yet", noLeader, msg(raftpb.MsgApp, 3, 5), true},
		{"a transfer forwarded to the leader", leader, msg(raftpb.MsgTransferLeader, 3, 5), true},
		{"a transfer forwarded to a follower (raft panics forwarding it)", follower, msg(raftpb.MsgTransferLeader, 3, 5), false},
		{"a vote", follower, msg(raftpb.MsgVote, 3, 6), true},
	} {
		if needs := needsRaftState(c.m.GetType()); !needs && !c.want {
			t.Errorf("%s: needsRaftState says it is not checked", c.name)
		}
		if got := fitsRaftState(c.st, c.m); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
