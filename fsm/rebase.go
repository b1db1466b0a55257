package fsm

import (
	"fmt"

	"github.com/leased/leased/api/leasepb"
)

// Rebase prepares a state restored from a backup to found a new cluster whose log starts after floor
// (decision 12: tokens never go backwards, even across a restore). The applied index becomes floor, so
// the new cluster's first entry has index floor+1 and every token it grants is above floor; the highest
// token stays what the old cluster granted before the backup (the next grant is still larger).
//
// Every lease forgets its checkpoint and counts as renewed, so the new cluster's first leader gives it
// a full TTL from its takeover: the holder may be alive and renewing against the new cluster, and a
// remainder checkpointed when the backup was taken measures time that passed long ago. A lease whose
// holder is gone expires one TTL after the new cluster starts. Lock-delays and the remembered lease ends
// (index-based, and below floor) stay as they are; the lessor counts a lock-delay's full length from
// when it starts, never less.
//
// The member table becomes members (the new cluster's founding voters; decision 11) and no id counts as
// removed: the old cluster's members and their addresses belong to the old cluster.
//
// The generation goes up by one (lineage.go); the caller records the new cluster's id (SetClusterID).
//
// floor must be at least the applied index; the state is unchanged on error.
func (f *FSM) Rebase(floor uint64, members []*leasepb.Member) error {
	if floor < f.applied {
		return fmt.Errorf("%w: floor %d is below the applied index %d", ErrIndexNotIncreasing, floor, f.applied)
	}
	f.members, f.removed = make(map[uint64]*leasepb.Member, len(members)), make(map[uint64]bool)
	for _, m := range members {
		c := cleanMember(m)
		c.IsLearner = m.GetIsLearner()
		f.members[m.GetId()] = c
	}
	all := make([]*lease, 0, f.byResource.Len()) // writable changes the tree: not while ascending it
	f.byResource.Ascend(func(e entry) bool {
		all = append(all, e.lease)
		return true
	})
	for _, l := range all {
		l = f.writable(l)
		l.set(flagCheckpointed, false)
		l.set(flagRenewed, true)
		l.remainingMs = 0
	}
	f.applied = floor
	f.generation++
	return nil
}
