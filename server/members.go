package server

import (
	"fmt"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/fsm"
)

// The member table lives in the state machine (fsm/members.go), applied from conf-change entries and
// carried in snapshots, so every node has the same table at the same index and a restart rebuilds it from
// the log, never from flags (decision 11; docs/design.md, "Membership"). This file keeps raft, the table
// and the peer transport in step as entries apply.

// member returns a copy of a member's record, or nil.
func (n *node) member(id uint64) *leasepb.Member {
	n.fsmMu.RLock()
	defer n.fsmMu.RUnlock()
	return n.sm.Member(id)
}

// memberTable returns the member table, each record marked with whether it is the leader this node knows.
func (n *node) memberTable() []*leasepb.Member {
	n.fsmMu.RLock()
	ms := n.sm.Members()
	n.fsmMu.RUnlock()
	leader := n.knownLeader()
	for _, m := range ms {
		m.IsLeader = m.GetId() == leader
	}
	return ms
}

// clientAddrOf is a member's advertised client address, for leader hints ("" if unknown). It comes from
// the member table alone: an address gossip carries is a hint anyone in the gossip pool can make up, so
// no client is sent there until the member announced it through raft (announceLoop).
func (n *node) clientAddrOf(id uint64) string {
	switch id {
	case raft.None:
		return ""
	case n.id:
		return n.clientAddr
	}
	if p := n.clientAddrs.Load(); p != nil {
		return (*p)[id]
	}
	return ""
}

// applyConfChange applies a conf-change entry: to raft, then to the member table, then to the transport.
// A change that removes this node stops it (errRemoved): it is no longer part of the cluster.
func (n *node) applyConfChange(e *raftpb.Entry) error {
	cc, err := decodeConfChange(e)
	if err != nil {
		return err
	}
	n.confState = n.host.rn.ApplyConfChange(cc)
	changes := memberChanges(cc.AsV2())
	n.fsmMu.Lock()
	err = n.sm.ApplyMembers(e.GetIndex(), changes)
	n.fsmMu.Unlock()
	if err != nil {
		return err
	}
	n.syncPeers()
	for _, c := range changes {
		if c.Kind != fsm.MemberUpdate { // an update leaves raft's configuration as it was
			n.snapshots.ConfChanged()
		}
	}
	for _, c := range changes {
		if c.Kind == fsm.MemberRemove && c.Member.GetId() == n.id {
			return n.removed(e.GetIndex())
		}
	}
	return nil
}

// decodeConfChange decodes a conf-change entry of either version.
func decodeConfChange(e *raftpb.Entry) (raftpb.ConfChangeI, error) {
	if e.GetType() == raftpb.EntryType_EntryConfChange {
		v1 := new(raftpb.ConfChange)
		if err := proto.Unmarshal(e.GetData(), v1); err != nil {
			return nil, fmt.Errorf("decode conf change %d: %w", e.GetIndex(), err)
		}
		return v1, nil
	}
	v2 := new(raftpb.ConfChangeV2)
	if err := proto.Unmarshal(e.GetData(), v2); err != nil {
		return nil, fmt.Errorf("decode conf change %d: %w", e.GetIndex(), err)
	}
	return v2, nil
}

// memberChanges turns a conf change into the table's changes. The context is the changed member's record
// (leasepb.Member); a change of any other node carries only its id.
func memberChanges(cc *raftpb.ConfChangeV2) []fsm.MemberChange {
	ctx := new(leasepb.Member)
	if err := proto.Unmarshal(cc.GetContext(), ctx); err != nil {
		ctx = &leasepb.Member{}
	}
	var out []fsm.MemberChange
	for _, ch := range cc.GetChanges() {
		m := ctx
		if m.GetId() != ch.GetNodeId() {
			m = &leasepb.Member{Id: ch.GetNodeId()}
		}
		var kind fsm.MemberChangeKind
		switch ch.GetType() {
		case raftpb.ConfChangeType_ConfChangeAddNode:
			kind = fsm.MemberAddVoter
		case raftpb.ConfChangeType_ConfChangeAddLearnerNode:
			kind = fsm.MemberAddLearner
		case raftpb.ConfChangeType_ConfChangeRemoveNode:
			kind = fsm.MemberRemove
		case raftpb.ConfChangeType_ConfChangeUpdateNode:
			kind = fsm.MemberUpdate
		default:
			continue
		}
		out = append(out, fsm.MemberChange{Kind: kind, Member: m})
	}
	return out
}

// syncPeers gives the transport every member of the table (less this node) at the table's address, and
// drops the peers the table removed; it also refreshes the client addresses leader hints read (every
// answer carries one: a copy, so that no request takes the state machine's lock for it). A peer the table does not know yet stays: a joining node's seeds, or
// members whose conf changes have not applied yet. It runs on the Ready loop (and before it starts), which
// owns n.peers.
func (n *node) syncPeers() {
	n.fsmMu.RLock()
	ms := n.sm.Members()
	var gone []uint64
	for id := range n.peers {
		if n.sm.WasRemoved(id) {
			gone = append(gone, id)
		}
	}
	n.fsmMu.RUnlock()
	for _, id := range gone {
		n.transport.RemovePeer(id)
		n.metrics.removePeer(id)
		delete(n.peers, id)
	}
	addrs := make(map[uint64]string, len(ms))
	for _, m := range ms {
		addrs[m.GetId()] = m.GetClientAddr()
	}
	n.clientAddrs.Store(&addrs)
	for _, m := range ms {
		id, addr := m.GetId(), m.GetPeerAddr()
		if id != n.id && addr != "" && n.peers[id] != addr {
			n.transport.AddPeer(id, addr) // an address change moves the peer
			n.metrics.addPeer(id)
			n.peers[id] = addr
		}
	}
}

// seedPeers lets a node that has applied no member table yet (a new member's first start) reach the
// members it was told of, so it can answer the leader that is about to send it the log.
func (n *node) seedPeers(ms []*leasepb.Member) {
	n.rememberSeeds(ms)
	for _, m := range ms {
		if m.GetId() != n.id && m.GetPeerAddr() != "" && n.peers[m.GetId()] == "" {
			n.transport.AddPeer(m.GetId(), m.GetPeerAddr())
			n.metrics.addPeer(m.GetId())
			n.peers[m.GetId()] = m.GetPeerAddr()
		}
	}
}

// removed records that this node was removed from the cluster at index, so that it never serves on this
// data dir again, and returns the error that stops it.
func (n *node) removed(index uint64) error {
	err := fmt.Errorf("%w: at index %d", ErrRemoved, index)
	if n.markRemoved != nil {
		if merr := n.markRemoved(err.Error()); merr != nil {
			return fmt.Errorf("%w (and the removal marker could not be written: %v)", err, merr)
		}
	}
	n.log.Warn("this node was removed from the cluster; stopping", "index", index)
	return err
}
