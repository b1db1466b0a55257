package server

import (
	"fmt"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/leased/leased/fsm"
)

// A MsgSnap replaces a follower's whole state, and raft persists it as soon as it accepts it. Two checks
// keep a forged or corrupt one out, both before raft sees it:
//
//   - its data is what the node would restore (checkSnapshotData, on the transport's goroutine: a decode
//     into a new state machine, the node's own untouched), and
//   - it comes from the leader this node follows in the message's term (fitsRaftState, on the Ready
//     loop, against raft's own view at the moment it would step it).
//
// A snapshot from a higher term than the node's is refused too, though raft would take it and learn the
// new leader from it: a new leader's first message to a follower is an append (raft probes before it
// sends a snapshot), which teaches the follower the term and the leader; the snapshot the leader sends
// after the follower's answer is then from the leader it follows. One refused in a race is sent again at
// the leader's next probe. Refusing it closes the gap a forged higher term would open: any member could
// otherwise name itself the leader of a term nobody has reached and replace a follower's state.

// checkSnapshotData decodes a snapshot's data as restoreSnapshot would and checks the metadata raft acts
// on against it: the applied index is the snapshot's index, the configuration is the member table's
// (voters and learners, no joint configuration: membership changes one node at a time), the sender is a
// voter, and this node a member that was not removed.
func checkSnapshotData(s *raftpb.Snapshot, self, from uint64) error {
	sm, err := fsm.Restore(s.GetData())
	if err != nil {
		return err
	}
	md := s.GetMetadata()
	if sm.AppliedIndex() != md.GetIndex() {
		return fmt.Errorf("snapshot at index %d holds the state at %d", md.GetIndex(), sm.AppliedIndex())
	}
	cs := md.GetConfState()
	if len(cs.GetVotersOutgoing()) > 0 || len(cs.GetLearnersNext()) > 0 || cs.GetAutoLeave() {
		return fmt.Errorf("snapshot at index %d has a joint configuration", md.GetIndex())
	}
	learner := make(map[uint64]bool)
	for _, m := range sm.Members() {
		learner[m.GetId()] = m.GetIsLearner()
	}
	if len(learner) != len(cs.GetVoters())+len(cs.GetLearners()) {
		return fmt.Errorf("snapshot at index %d: %d members for a configuration of %d", md.GetIndex(), len(learner), len(cs.GetVoters())+len(cs.GetLearners()))
	}
	for _, id := range cs.GetVoters() {
		if l, ok := learner[id]; !ok || l {
			return fmt.Errorf("snapshot at index %d: voter %016x is not a voting member", md.GetIndex(), id)
		}
	}
	for _, id := range cs.GetLearners() {
		if l, ok := learner[id]; !ok || !l {
			return fmt.Errorf("snapshot at index %d: learner %016x is not a learner member", md.GetIndex(), id)
		}
	}
	if _, ok := learner[self]; !ok || sm.WasRemoved(self) {
		return fmt.Errorf("snapshot at index %d does not have this node as a member", md.GetIndex())
	}
	if l, ok := learner[from]; !ok || l {
		return fmt.Errorf("snapshot at index %d: its sender %016x is not a voter", md.GetIndex(), from)
	}
	return nil
}

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
