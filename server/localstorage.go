package server

import (
	"fmt"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/leased/leased/fsm"
)

// Raft's asynchronous storage writes (raft.Config.AsyncStorageWrites, doc.go "Usage with Asynchronous
// Storage Writes"). Each Ready carries, among its messages, at most one MsgStorageAppend (entries, a
// HardState and a snapshot to make durable) for raft.LocalAppendThread and one MsgStorageApply
// (committed entries) for raft.LocalApplyThread. Each carries responses to deliver once it is done:
// to this node (raft learns that the entries are stable or applied, and a leader or candidate hears its
// own acknowledgement or vote) or to peers (a follower's acknowledgement, a vote). Nothing replaces
// Advance: delivering the responses is how raft learns that a Ready was handled. The Ready loop plays
// both threads itself, in order (handleReady).

// splitLocal separates a Ready's messages into its append and apply messages (nil if none) and the
// messages to peers.
func splitLocal(msgs []*raftpb.Message) (appendMsg, applyMsg *raftpb.Message, peers []*raftpb.Message) {
	peers = make([]*raftpb.Message, 0, len(msgs))
	for _, m := range msgs {
		switch m.GetTo() {
		case raft.LocalAppendThread:
			appendMsg = m
		case raft.LocalApplyThread:
			applyMsg = m
		default:
			peers = append(peers, m)
		}
	}
	return appendMsg, applyMsg, peers
}

// lastIndexOf is the last log index an append message writes: its last entry's, or its snapshot's
// (0: it writes only a HardState).
func lastIndexOf(m *raftpb.Message) uint64 {
	if ents := m.GetEntries(); len(ents) > 0 {
		return ents[len(ents)-1].GetIndex()
	}
	return m.GetSnapshot().GetMetadata().GetIndex()
}

// appendLocal makes an append message durable (persist), restores the snapshot it may carry into the
// state machine, and only then delivers its responses. mustSync is raft's verdict on the Ready it came
// in (raft.Ready.MustSync): false when only the commit index moved.
func (n *node) appendLocal(m *raftpb.Message, mustSync bool) error {
	var snap *raftpb.Snapshot
	var sm *fsm.FSM
	if s := m.GetSnapshot(); s != nil && !raft.IsEmptySnap(s) {
		// Decoded before it is persisted: the peer checks refuse data that does not decode, and should
		// one ever get through, the node stops now rather than on every restart.
		var err error
		if sm, err = fsm.Restore(s.GetData()); err != nil {
			return fmt.Errorf("restore snapshot at %d: %w", s.GetMetadata().GetIndex(), err)
		}
		snap = s
	}
	err := n.persist(hardStateOf(m), m.GetEntries(), snap, mustSync)
	n.appending.Store(0)
	if err != nil {
		return err
	}
	if snap != nil {
		if err := n.restoreSnapshot(snap, sm); err != nil {
			return err
		}
	}
	n.deliverResponses(m.GetResponses())
	return nil
}

// hardStateOf is the HardState an append message carries, or nil: raft sets Term, Vote and Commit
// together when the HardState changed, and none of them otherwise.
func hardStateOf(m *raftpb.Message) *raftpb.HardState {
	if m.Term == nil && m.Vote == nil && m.Commit == nil {
		return nil
	}
	return &raftpb.HardState{Term: m.Term, Vote: m.Vote, Commit: m.Commit}
}

// applyLocal applies an apply message's committed entries, then tells raft they are applied.
func (n *node) applyLocal(m *raftpb.Message) error {
	if ents := m.GetEntries(); len(ents) > 0 {
		start := time.Now()
		if err := n.state.Apply(ents); err != nil {
			return err
		}
		n.audit.handOff()
		n.metrics.applySeconds.Observe(since(start))
	}
	n.deliverResponses(m.GetResponses())
	return nil
}

// deliverResponses hands a finished storage write's responses on: those to peers to the transport
// first (a follower's acknowledgement is what the leader waits for), then those to this node back into
// raft, in order, at once (not through stepPeer, whose checks refuse a message from this node itself).
// Raft refuses only a response from a peer it stopped tracking (this node, removed): dropped, as
// raft.Node dropped it.
func (n *node) deliverResponses(resps []*raftpb.Message) {
	var peers []*raftpb.Message
	for _, r := range resps {
		if r.GetTo() != n.id {
			peers = append(peers, r)
		}
	}
	if len(peers) > 0 {
		n.transport.Send(peers)
	}
	for _, r := range resps {
		if r.GetTo() != n.id {
			continue
		}
		_ = n.host.rn.Step(r)
	}
}
