package raftnode

import (
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// A MsgSnap replaces a follower's whole state, and raft persists it as soon as it accepts it: besides
// the checks of its data before it reaches the loop, it must come from the leader this node follows in
// the message's term. One from a higher term is refused too, though raft would take it: a new leader's
// first message to a follower is an append (raft probes before it sends a snapshot), which teaches the
// follower the term and the leader, so a snapshot refused in that race is sent again at the next probe;
// and any member could otherwise name itself the leader of a term nobody has reached and replace a
// follower's state.

// fitsRaftState reports whether raft, in state st, may step m: the checks that need raft's own view at
// the moment the Ready loop steps it (needsRaftState says which messages).
//
// A leader's message (an append, a heartbeat, a snapshot) must come from the leader raft knows for its
// term. Raft takes any of them in the current term as the leader's and names the sender its leader: a
// member other than the leader could commit what the follower holds but the cluster did not commit, or
// replace its state. A term has one leader, so one that raft knows already is the only sender of these in
// that term. A snapshot must also come to a follower in the current term from the leader it follows (see
// above); an append or a heartbeat from a higher term, or in a term whose leader raft does not know yet,
// is how a follower learns of its leader.
//
// A leadership transfer from a peer is one a follower forwarded to its leader. Only the leader may take
// it: a follower forwards it again, and raft panics sending a forwarded one (it carries a term).
func fitsRaftState(st raft.BasicStatus, m *raftpb.Message) bool {
	switch m.GetType() {
	case raftpb.MsgSnap:
		return st.RaftState == raft.StateFollower && st.Lead != raft.None && st.Lead == m.GetFrom() && st.GetTerm() == m.GetTerm()
	case raftpb.MsgApp, raftpb.MsgHeartbeat:
		return m.GetTerm() != st.GetTerm() || st.Lead == raft.None || st.Lead == m.GetFrom()
	case raftpb.MsgTransferLeader:
		return st.RaftState == raft.StateLeader
	}
	return true
}

// needsRaftState: the messages fitsRaftState checks.
func needsRaftState(t raftpb.MessageType) bool {
	return t == raftpb.MsgSnap || t == raftpb.MsgApp || t == raftpb.MsgHeartbeat || t == raftpb.MsgTransferLeader
}
