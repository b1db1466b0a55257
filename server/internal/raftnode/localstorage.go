package raftnode

import (
	"fmt"
	"sync/atomic"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Raft's asynchronous storage writes (raft.Config.AsyncStorageWrites, doc.go "Usage with Asynchronous
// Storage Writes"). Each Ready carries, among its messages, at most one MsgStorageAppend (entries, a
// HardState and a snapshot to make durable) for raft.LocalAppendThread and one MsgStorageApply
// (committed entries) for raft.LocalApplyThread. Each carries responses to deliver once it is done:
// to this node (raft learns that the entries are stable or applied, and a leader or candidate hears its
// own acknowledgement or vote) or to peers (a follower's acknowledgement, a vote). Nothing replaces
// Advance: delivering the responses is how raft learns that a Ready was handled. The Ready loop plays
// both threads itself, in order (LocalStorage).

// SplitLocal separates a Ready's messages into its append and apply messages (nil if none) and the
// messages to peers.
func SplitLocal(msgs []*raftpb.Message) (appendMsg, applyMsg *raftpb.Message, peers []*raftpb.Message) {
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

// LocalStorage plays raft's two local storage threads on the Ready loop: the append and the apply, each
// delivering its responses only once its work is done. S is the state machine a snapshot decodes into.
// Append, Apply and Begin run on the loop; Appending on any goroutine.
type LocalStorage[S any] struct {
	cfg LocalStorageConfig[S]
	// appending is the last index of the log append in flight (0: none).
	appending atomic.Uint64
}

// LocalStorageConfig is what LocalStorage needs of the node.
type LocalStorageConfig[S any] struct {
	// Persist makes a log append durable; mustSync is raft's verdict on the Ready it came in
	// (raft.Ready.MustSync): false when only the commit index moved.
	Persist func(hs *raftpb.HardState, ents []*raftpb.Entry, snap *raftpb.Snapshot, mustSync bool) error
	// Decode decodes a snapshot's data into a state machine; Restore makes it the node's, once the
	// snapshot is durable.
	Decode  func(data []byte) (S, error)
	Restore func(snap *raftpb.Snapshot, sm S) error
	// Apply applies committed entries to the state machine.
	Apply func(ents []*raftpb.Entry) error
	// Deliver hands a finished write's responses on: to the peers, and back into raft.
	Deliver func(resps []*raftpb.Message)
}

// NewLocalStorage returns a LocalStorage with no append in flight.
func NewLocalStorage[S any](cfg LocalStorageConfig[S]) *LocalStorage[S] {
	return &LocalStorage[S]{cfg: cfg}
}

// Begin records that the append message m is in flight: peers may acknowledge its entries before its
// write returns, and the peer checks count them as part of the log (Appending).
func (l *LocalStorage[S]) Begin(m *raftpb.Message) { l.appending.Store(lastIndexOf(m)) }

// Appending is the last index of the log append in flight, whose entries the peers may already have
// (0: none).
func (l *LocalStorage[S]) Appending() uint64 { return l.appending.Load() }

// Append makes an append message durable (Persist), restores the snapshot it may carry into the state
// machine, and only then delivers its responses. mustSync is raft's verdict on the Ready it came in.
func (l *LocalStorage[S]) Append(m *raftpb.Message, mustSync bool) error {
	var snap *raftpb.Snapshot
	var sm S
	if s := m.GetSnapshot(); s != nil && !raft.IsEmptySnap(s) {
		// Decoded before it is persisted: the peer checks refuse data that does not decode, and should
		// one ever get through, the node stops now rather than on every restart.
		var err error
		if sm, err = l.cfg.Decode(s.GetData()); err != nil {
			return fmt.Errorf("restore snapshot at %d: %w", s.GetMetadata().GetIndex(), err)
		}
		snap = s
	}
	err := l.cfg.Persist(hardStateOf(m), m.GetEntries(), snap, mustSync)
	l.appending.Store(0)
	if err != nil {
		return err
	}
	if snap != nil {
		if err := l.cfg.Restore(snap, sm); err != nil {
			return err
		}
	}
	l.cfg.Deliver(m.GetResponses())
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

// Apply applies an apply message's committed entries, then tells raft they are applied.
func (l *LocalStorage[S]) Apply(m *raftpb.Message) error {
	if ents := m.GetEntries(); len(ents) > 0 {
		if err := l.cfg.Apply(ents); err != nil {
			return err
		}
	}
	l.cfg.Deliver(m.GetResponses())
	return nil
}
