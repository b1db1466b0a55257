package fsm

import (
	"cmp"
	"fmt"
	"slices"

	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/leasepb"
)

// The member table: the Raft configuration's members with their names and addresses (decision 11). It
// lives here, beside the leases, so that it is applied from the log in order, carried in every snapshot
// and restored with it, identically on every node. The server turns each applied raft conf change into one
// MemberChange per changed node; raft itself stays the authority on who votes, and the table mirrors it.

// MemberChangeKind is what a conf change did to one node.
type MemberChangeKind int

const (
	// MemberAddLearner adds a non-voting member (or records new metadata of one that is already in).
	MemberAddLearner MemberChangeKind = iota + 1
	// MemberAddVoter adds a voter, or promotes a learner (keeping its recorded addresses).
	MemberAddVoter
	// MemberUpdate replaces a member's addresses; its role stays.
	MemberUpdate
	// MemberRemove removes a member; its id is remembered as removed for good.
	MemberRemove
)

// MemberChange is one node's part of an applied conf change. Member carries the node's metadata (the conf
// change's context); for MemberRemove only its Id matters.
type MemberChange struct {
	Kind   MemberChangeKind
	Member *leasepb.Member
}

// ApplyMembers applies the member changes of the conf-change entry at index and advances to it. Changes
// that do not fit the table (promoting or updating an unknown member, removing one that is not there) are
// applied as raft applies them, as no-ops, so that the table never disagrees with raft's configuration.
func (f *FSM) ApplyMembers(index uint64, changes []MemberChange) error {
	if index <= f.applied {
		return fmt.Errorf("%w: got %d after %d", ErrIndexNotIncreasing, index, f.applied)
	}
	for _, c := range changes {
		f.applyMember(c)
	}
	f.applied = index
	return nil
}

func (f *FSM) applyMember(c MemberChange) {
	id := c.Member.GetId()
	if id == 0 {
		return
	}
	old, known := f.members[id]
	switch c.Kind {
	case MemberAddLearner, MemberAddVoter:
		if f.removed[id] {
			return // raft refuses nothing here, but a removed id never rejoins the table
		}
		m := cleanMember(c.Member)
		if known && m.GetName() == "" { // a promotion without metadata keeps what the table knows
			m = proto.Clone(old).(*leasepb.Member)
		}
		// raft: adding a learner that is already a voter is a demotion; we never propose one, and keep the
		// role raft would give.
		m.IsLearner = c.Kind == MemberAddLearner
		f.members[id] = m
	case MemberUpdate:
		if known {
			m := cleanMember(c.Member)
			m.IsLearner = old.GetIsLearner()
			f.members[id] = m
		}
	case MemberRemove:
		delete(f.members, id)
		f.removed[id] = true
	}
}

// cleanMember is the part of a conf change's member that the table keeps.
func cleanMember(m *leasepb.Member) *leasepb.Member {
	return &leasepb.Member{Id: m.GetId(), Name: m.GetName(), PeerAddr: m.GetPeerAddr(), ClientAddr: m.GetClientAddr()}
}

// Members returns copies of the member table's records, sorted by id.
func (f *FSM) Members() []*leasepb.Member {
	out := make([]*leasepb.Member, 0, len(f.members))
	for _, m := range f.members {
		out = append(out, proto.Clone(m).(*leasepb.Member))
	}
	slices.SortFunc(out, func(a, b *leasepb.Member) int { return cmp.Compare(a.GetId(), b.GetId()) })
	return out
}

// Member returns a copy of one member's record, or nil.
func (f *FSM) Member(id uint64) *leasepb.Member {
	if m, ok := f.members[id]; ok {
		return proto.Clone(m).(*leasepb.Member)
	}
	return nil
}

// IsMember reports whether id is in the member table; with an empty table (a node that has not yet
// applied its first configuration) every id is.
func (f *FSM) IsMember(id uint64) bool {
	_, ok := f.members[id]
	return ok || len(f.members) == 0
}

// MemberByName returns a copy of the record of the member called name, or nil.
func (f *FSM) MemberByName(name string) *leasepb.Member {
	for _, m := range f.members {
		if m.GetName() == name {
			return proto.Clone(m).(*leasepb.Member)
		}
	}
	return nil
}

// WasRemoved reports whether the raft id id was ever removed from the cluster.
func (f *FSM) WasRemoved(id uint64) bool { return f.removed[id] }

// removedIDs are the removed ids, sorted, for the snapshot.
func (f *FSM) removedIDs() []uint64 {
	out := make([]uint64, 0, len(f.removed))
	for id := range f.removed {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// restoreMembers rebuilds the table from a snapshot body's records, which must be sorted by id and unique.
func (f *FSM) restoreMembers(members []*leasepb.Member, removed []uint64) error {
	var prev uint64
	for i, m := range members {
		switch {
		case m.GetId() == 0 || m.GetId() <= prev:
			return fmt.Errorf("%w: member %d out of order, duplicated or without id", ErrBadSnapshot, i)
		case m.GetIsLeader():
			return fmt.Errorf("%w: member %d records leadership", ErrBadSnapshot, i)
		}
		prev = m.GetId()
		c := cleanMember(m)
		c.IsLearner = m.GetIsLearner()
		f.members[m.GetId()] = c
	}
	prev = 0
	for _, id := range removed {
		if id == 0 || id <= prev || f.members[id] != nil {
			return fmt.Errorf("%w: removed member %016x out of order or still a member", ErrBadSnapshot, id)
		}
		prev = id
		f.removed[id] = true
	}
	return nil
}
