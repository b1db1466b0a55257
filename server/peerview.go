package server

import (
	"fmt"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/leased/leased/fsm"
)

// A MsgSnap replaces a follower's whole state, and raft persists it as soon as it accepts it. Two checks
// keep a forged or corrupt one out, both before raft sees it:
//
//   - its data is what the node would restore (checkSnapshotData, on the transport's goroutine: a decode
//     into a new state machine, the node's own untouched), and
//   - it comes from the leader this node follows in the message's term (internal/raftnode's
//     fitsRaftState, on the Ready loop, against raft's own view at the moment it would step it).
//
// Why one from a higher term than the node's is refused too is told beside fitsRaftState
// (internal/raftnode).

// checkSnapshotData (raftnode.Config.CheckSnapshot) decodes a snapshot's data as a restore would and
// checks the metadata raft acts on against it: the applied index is the snapshot's index, the
// configuration is the member table's (voters and learners, no joint configuration: membership changes
// one node at a time), the sender is a voter, and this node a member that was not removed.
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
