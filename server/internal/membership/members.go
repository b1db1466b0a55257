package membership

import (
	"cmp"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server/internal/errs"
	"github.com/leased/leased/server/internal/ids"
)

// The member table lives in the state machine (fsm/members.go), applied from conf-change entries and
// carried in snapshots, so every node has the same table at the same index and a restart rebuilds it from
// the log, never from flags (decision 11; docs/design.md, "Membership"). This file keeps raft, the table
// and the peer transport in step as entries apply.

// Members is the node's side of the member table: the conf changes the leader makes, automatic
// promotion among them (changes.go, promote.go); the peers, client addresses and seeds that follow the
// table (this file); a member's Join, address announcement, removal check and gossip (join.go, rejoin.go,
// gossip.go). It reaches the rest of the node only through Host.
type Members struct {
	cfg       Config
	log       *slog.Logger
	id        uint64
	clusterID uint64
	host      Host
	logIndex  Log // the raft log, for conf changes not applied yet and an empty log

	// peers are the transport's peers and their addresses (Ready loop only).
	peers map[uint64]string
	// clientAddrs are the member table's client addresses by raft id, replaced whole by SyncPeers.
	clientAddrs atomic.Pointer[map[uint64]string]
	// confSem admits one membership change at a time (changes.go).
	confSem chan struct{}
	// gossip is nil without a gossip address (gossip.go); set by SetGossip before the loops start.
	gossip *Gossip

	// seedNames are the members the node was told of before it applied a member table (--initial-cluster,
	// a join's answer), by name: whose a peer certificate is until the table says (MemberByName).
	seedMu    sync.Mutex
	seedNames map[string]uint64
}

// Log is the part of the raft log Members reads: its last index (an empty log), and, when it is a
// raft.Storage, the entries not applied yet (a conf change pending).
type Log interface {
	LastIndex() (uint64, error)
}

// New builds the membership of node id in cluster clusterID.
func New(cfg Config, log *slog.Logger, id, clusterID uint64, host Host, logIndex Log) *Members {
	return &Members{
		cfg: cfg, log: log, id: id, clusterID: clusterID, host: host, logIndex: logIndex,
		peers:   make(map[uint64]string),
		confSem: make(chan struct{}, 1),
	}
}

// SetGossip hands Members the node's gossip, for GossipLoop.
func (mb *Members) SetGossip(g *Gossip) { mb.gossip = g }

// Member returns a copy of a member's record, or nil.
func (mb *Members) Member(id uint64) *leasepb.Member {
	var m *leasepb.Member
	mb.host.ReadFSM(func(sm *fsm.FSM) { m = sm.Member(id) })
	return m
}

// Table returns the member table, each record marked with whether it is the leader this node knows.
func (mb *Members) Table() []*leasepb.Member {
	var ms []*leasepb.Member
	mb.host.ReadFSM(func(sm *fsm.FSM) { ms = sm.Members() })
	leader := mb.host.KnownLeader()
	for _, m := range ms {
		m.IsLeader = m.GetId() == leader
	}
	return ms
}

// ClientAddrOf is a member's advertised client address, for leader hints ("" if unknown). It comes from
// the member table alone: an address gossip carries is a hint anyone in the gossip pool can make up, so
// no client is sent there until the member announced it through raft (AnnounceLoop).
func (mb *Members) ClientAddrOf(id uint64) string {
	switch id {
	case raft.None:
		return ""
	case mb.id:
		return mb.cfg.ClientAddr
	}
	if p := mb.clientAddrs.Load(); p != nil {
		return (*p)[id]
	}
	return ""
}

// ApplyConfChange applies a conf-change entry: to raft, then to the member table, then to the transport.
// A change that removes this node stops it (errRemoved): it is no longer part of the cluster.
func (mb *Members) ApplyConfChange(e *raftpb.Entry) error {
	cc, err := DecodeConfChange(e)
	if err != nil {
		return err
	}
	changes := MemberChanges(cc.AsV2())
	reconfigures := false
	for _, c := range changes {
		if c.Kind != fsm.MemberUpdate { // an update leaves raft's configuration as it was
			reconfigures = true
		}
	}
	mb.host.ApplyConfChange(cc, reconfigures)
	if err := mb.host.ApplyMembers(e.GetIndex(), changes); err != nil {
		return err
	}
	mb.SyncPeers()
	for _, c := range changes {
		if c.Kind == fsm.MemberRemove && c.Member.GetId() == mb.id {
			return mb.Removed(e.GetIndex())
		}
	}
	return nil
}

// DecodeConfChange decodes a conf-change entry of either version.
func DecodeConfChange(e *raftpb.Entry) (raftpb.ConfChangeI, error) {
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

// MemberChanges turns a conf change into the table's changes. The context is the changed member's record
// (leasepb.Member); a change of any other node carries only its id.
func MemberChanges(cc *raftpb.ConfChangeV2) []fsm.MemberChange {
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

// SyncPeers gives the transport every member of the table (less this node) at the table's address, and
// drops the peers the table removed; it also refreshes the client addresses leader hints read (every
// answer carries one: a copy, so that no request takes the state machine's lock for it). A peer the table does not know yet stays: a joining node's seeds, or
// members whose conf changes have not applied yet. It runs on the Ready loop (and before it starts), which
// owns mb.peers.
func (mb *Members) SyncPeers() {
	var ms []*leasepb.Member
	var gone []uint64
	mb.host.ReadFSM(func(sm *fsm.FSM) {
		ms = sm.Members()
		for id := range mb.peers {
			if sm.WasRemoved(id) {
				gone = append(gone, id)
			}
		}
	})
	for _, id := range gone {
		mb.host.RemovePeer(id)
		delete(mb.peers, id)
	}
	addrs := make(map[uint64]string, len(ms))
	for _, m := range ms {
		addrs[m.GetId()] = m.GetClientAddr()
	}
	mb.clientAddrs.Store(&addrs)
	for _, m := range ms {
		id, addr := m.GetId(), m.GetPeerAddr()
		if id != mb.id && addr != "" && mb.peers[id] != addr {
			mb.host.AddPeer(id, addr) // an address change moves the peer
			mb.peers[id] = addr
		}
	}
}

// SeedPeers lets a node that has applied no member table yet (a new member's first start) reach the
// members it was told of, so it can answer the leader that is about to send it the log.
func (mb *Members) SeedPeers(ms []*leasepb.Member) {
	mb.rememberSeeds(ms)
	for _, m := range ms {
		if m.GetId() != mb.id && m.GetPeerAddr() != "" && mb.peers[m.GetId()] == "" {
			mb.host.AddPeer(m.GetId(), m.GetPeerAddr())
			mb.peers[m.GetId()] = m.GetPeerAddr()
		}
	}
}

// Removed records that this node was removed from the cluster at index, so that it never serves on this
// data dir again, and returns the error that stops it.
func (mb *Members) Removed(index uint64) error {
	err := fmt.Errorf("%w: at index %d", errs.ErrRemoved, index)
	if mb.cfg.MarkRemoved != nil {
		if merr := mb.cfg.MarkRemoved(err.Error()); merr != nil {
			return fmt.Errorf("%w (and the removal marker could not be written: %v)", err, merr)
		}
	}
	mb.log.Warn("this node was removed from the cluster; stopping", "index", index)
	return err
}

// IsMember reports whether id is in the member table (fsm.IsMember: any id before the node applied
// its first configuration). It runs for every peer message, so it reads the table's copy SyncPeers keeps
// (clientAddrs, keyed by every member's id) rather than wait on fsmMu while an apply batch holds it.
func (mb *Members) IsMember(id uint64) bool {
	if addrs := mb.clientAddrs.Load(); addrs != nil {
		_, ok := (*addrs)[id]
		return ok || len(*addrs) == 0
	}
	var ok bool
	mb.host.ReadFSM(func(sm *fsm.FSM) { ok = sm.IsMember(id) })
	return ok
}

// MemberByName is the raft id of the member called name: the transport's MemberID, which tells whose a
// peer certificate is. A removed member's certificate names no member.
func (mb *Members) MemberByName(name string) (uint64, bool) {
	var id uint64
	var found, empty bool
	mb.host.ReadFSM(func(sm *fsm.FSM) {
		if m := sm.MemberByName(name); m != nil && !sm.WasRemoved(m.GetId()) {
			id, found = m.GetId(), true
		}
		empty = len(sm.Members()) == 0
	})
	if found {
		return id, true
	}
	// Before the node applied its first configuration (a founding member's first start, a joining
	// node's), the members it was told of. Not any name: a certificate also naming localhost, say, would
	// name two members and be refused.
	if empty {
		mb.seedMu.Lock()
		defer mb.seedMu.Unlock()
		id, ok := mb.seedNames[name]
		return id, ok
	}
	return 0, false
}

// rememberSeeds records ms as the members a certificate may name before the node applies a member table.
func (mb *Members) rememberSeeds(ms []*leasepb.Member) {
	mb.seedMu.Lock()
	defer mb.seedMu.Unlock()
	if mb.seedNames == nil {
		mb.seedNames = make(map[string]uint64, len(ms))
	}
	for _, m := range ms {
		mb.seedNames[m.GetName()] = m.GetId()
	}
}

// InitialMembers returns the founding members as raft peers, for a new cluster's bootstrap conf changes
// (raft bootstraps with them only on an empty log), and lets the transport reach them until those entries apply.
// Their context is each member's record as --initial-cluster gives it (name and peer address): every
// founding node must write identical entries, so the client addresses, which only each node knows of
// itself, are announced into the table afterwards (AnnounceLoop).
//
// The peers are sorted by raft id: every founding node writes the bootstrap conf changes 1..n itself, and
// raft's log matching requires them to be identical on every node (same index and term, same bytes).
func (mb *Members) InitialMembers() ([]raft.Peer, error) {
	var peers []raft.Peer
	var seed []*leasepb.Member
	for name, addr := range mb.cfg.InitialCluster {
		m := &leasepb.Member{Id: ids.Member(mb.clusterID, name), Name: name, PeerAddr: addr}
		seed = append(seed, m)
		ctx, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			return nil, fmt.Errorf("encode member %s: %w", name, err)
		}
		peers = append(peers, raft.Peer{ID: m.Id, Context: ctx})
	}
	slices.SortFunc(peers, func(a, b raft.Peer) int { return cmp.Compare(a.ID, b.ID) })
	if last, err := mb.logIndex.LastIndex(); err == nil && last == 0 { // an empty log
		mb.SeedPeers(seed)
	} else {
		mb.rememberSeeds(seed) // until the log's table applies again
	}
	return peers, nil
}
