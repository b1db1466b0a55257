package server

import (
	"fmt"
	"sync/atomic"
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

// localStorage plays raft's two local storage threads on the Ready loop: the append and the apply,
// each delivering its responses only once its work is done. It reaches the node through function values
// (newLocalStorage).
type localStorage struct {
	// appending is the last index of the log append in flight, whose entries the peers may already
	// have (0: none; peerView.lastIndex). The loop writes it; any goroutine reads it.
	appending atomic.Uint64
	// persist makes a log append durable (node.persist); mustSync is raft's verdict on its Ready.
	persist func(hs *raftpb.HardState, ents []*raftpb.Entry, snap *raftpb.Snapshot, mustSync bool) error
	// restore replaces the state machine with sm, decoded from snap, once snap is durable.
	restore func(snap *raftpb.Snapshot, sm *fsm.FSM) error
	// apply applies committed entries to the state machine.
	apply func(ents []*raftpb.Entry) error
	// deliver hands a finished write's responses on (raftHost.deliver).
	deliver func(resps []*raftpb.Message)
}

// newLocalStorage returns n's local storage threads. What they call of n they read at each call: the
// raft host comes after them, and tests put a StorageFault before the log.
func newLocalStorage(n *node) *localStorage {
	return &localStorage{
		persist: n.persist,
		restore: n.restoreSnapshot,
		apply: func(ents []*raftpb.Entry) error {
			start := time.Now()
			if err := n.applyEntries(ents); err != nil {
				return err
			}
			n.audit.handOff()
			n.metrics.applySeconds.Observe(since(start))
			return nil
		},
		deliver: func(resps []*raftpb.Message) { n.host.deliver(resps) },
	}
}

// appendLocal makes an append message durable (persist), restores the snapshot it may carry into the
// state machine, and only then delivers its responses. mustSync is raft's verdict on the Ready it came
// in (raft.Ready.MustSync): false when only the commit index moved.
func (l *localStorage) appendLocal(m *raftpb.Message, mustSync bool) error {
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
	err := l.persist(hardStateOf(m), m.GetEntries(), snap, mustSync)
	l.appending.Store(0)
	if err != nil {
		return err
	}
	if snap != nil {
		if err := l.restore(snap, sm); err != nil {
			return err
		}
	}
	l.deliver(m.GetResponses())
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
func (l *localStorage) applyLocal(m *raftpb.Message) error {
	if ents := m.GetEntries(); len(ents) > 0 {
		if err := l.apply(ents); err != nil {
			return err
		}
	}
	l.deliver(m.GetResponses())
	return nil
}
