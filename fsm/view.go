package fsm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"sync/atomic"

	"github.com/google/btree"
	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/wirepb"
)

// Views: a snapshot without stopping the apply. Encoding a million leases takes some 0.4 s; done under the
// FSM's lock on the node's Ready loop it stalled every node at once (all snapshot at the same index) long
// enough to cost the leader. A View freezes the state in O(1) under that lock instead, and is encoded
// afterwards, on any goroutine, while the FSM goes on applying:
//
//   - the lease tree is a copy-on-write clone (btree.Clone): each side copies a node before changing it;
//   - a lease the tree shares with a view is never changed in place: the FSM counts views in epoch, every
//     lease remembers the epoch it was made in, and while a view is live (taken, not yet released) a lease
//     older than the latest view is copied (writable) before a checkpoint, renewal mark or proclaim changes
//     it. Once every view is released nothing is shared, and leases change in place again: a view lives
//     only while it is encoded, so the idle checkpoints of a mass disconnect, one per lease, mostly find
//     none live and skip the copy and the re-indexing it costs;
//   - the bounded rest (remembered ends, lock-delays, the ACL, members, answered requests) is copied.

// View is the state machine frozen at one applied index, for encoding (Encode) while the FSM goes on.
type View struct {
	head, rest *wirepb.SnapshotBody // rest without Ends, built from ends by Encode
	leases     *btree.BTreeG[entry]
	ends       []leaseEnd // the remembered ends, oldest first: one copy, not a message each
	// live points at the FSM's count of live views; released says this view was released (Release).
	live     *atomic.Int32
	released atomic.Bool
}

// ErrViewReleased: Encode was called on a view after its Release.
var ErrViewReleased = errors.New("fsm: view already released")

// View freezes the current state. It changes f (as Apply does: the caller needs the same exclusive
// access), and only for a moment: its cost does not grow with the leases. The caller releases the view
// (Release) once done with it; until then every lease the FSM changes is copied first.
func (f *FSM) View() *View {
	f.epoch++
	f.liveViews.Add(1)
	ends := make([]leaseEnd, 0, f.ends.len())
	f.ends.ascend(func(e leaseEnd) { ends = append(ends, e) })
	return &View{
		head:   &wirepb.SnapshotBody{AppliedIndex: f.applied, HighestToken: f.highest},
		rest:   f.restBody(),
		leases: f.byResource.Clone(),
		ends:   ends,
		live:   &f.liveViews,
	}
}

// Release ends the view: it may no longer be encoded, and the FSM may again change in place the leases
// it shared. Call it once every Encode of the view has returned; a second call does nothing. A view never
// released is safe, only costly: the FSM goes on copying the leases it changes.
func (v *View) Release() {
	if v.released.CompareAndSwap(false, true) {
		v.live.Add(-1)
	}
}

// LiveViews is how many views of f are taken and not yet released.
func (f *FSM) LiveViews() int { return int(f.liveViews.Load()) }

// AppliedIndex is the index the view was taken at.
func (v *View) AppliedIndex() uint64 { return v.head.AppliedIndex }

// Leases is how many leases the view holds.
func (v *View) Leases() int { return v.leases.Len() }

// Encode encodes the view as a snapshot (Snapshot's format). It may run on any goroutine, concurrently
// with the FSM it came from, and more than once, until Release.
func (v *View) Encode() ([]byte, error) {
	if v.released.Load() {
		return nil, ErrViewReleased
	}
	rest := proto.CloneOf(v.rest) // Encode may run more than once, and concurrently
	rest.Ends = make([]*wirepb.LeaseEndRecord, 0, len(v.ends))
	for _, e := range v.ends {
		rest.Ends = append(rest.Ends, &wirepb.LeaseEndRecord{Resource: e.resource, Token: e.token, Index: e.index, How: endEventType[e.how]})
	}
	// One allocation of the exact size: the header, then the body encoded in place (snapshot_stream.go).
	size := headerSize + proto.Size(v.head) + leasesSize(v.leases) + proto.Size(rest)
	out := make([]byte, headerSize, size)
	out, err := encodeBody(out, v.head, v.leases, rest)
	if err != nil {
		return nil, fmt.Errorf("fsm: encode snapshot: %w", err)
	}
	payload := out[headerSize:]
	copy(out, snapshotMagic)
	binary.BigEndian.PutUint32(out[8:], snapshotVersion)
	binary.BigEndian.PutUint64(out[12:], uint64(len(payload)))
	binary.BigEndian.PutUint32(out[20:], crc32.Checksum(payload, castagnoli))
	return out, nil
}

// restBody is every field of the snapshot after the leases but the ends, copied.
func (f *FSM) restBody() *wirepb.SnapshotBody {
	rest := &wirepb.SnapshotBody{LockDelays: make([]*wirepb.LockDelayRecord, 0, len(f.delays))}
	for _, r := range sortedKeys(f.delays) {
		d := f.delays[r]
		rest.LockDelays = append(rest.LockDelays, &wirepb.LockDelayRecord{Resource: r, Token: d.token, Index: d.index, DelayMs: d.delayMs})
	}
	rest.ForgottenThrough = proto.Uint64(f.ends.forgottenThrough)
	if f.aclSet {
		rest.Acl = &wirepb.AclState{Rules: f.acl} // never changed in place (setACL replaces it)
	}
	rest.Members, rest.RemovedMembers = f.Members(), f.removedIDs()
	rest.AnsweredRequests = f.answeredRecords()
	rest.ClusterId, rest.Generation = f.clusterID, f.generation
	return rest
}

// writable returns l, or a copy of it that replaces it everywhere the FSM refers to it when a live view
// may share l: what the caller then changes is the FSM's alone.
func (f *FSM) writable(l *lease) *lease {
	if l.epoch == f.epoch || f.liveViews.Load() == 0 {
		return l
	}
	c := *l
	c.epoch = f.epoch
	f.byResource.ReplaceOrInsert(entry{&c})
	c.holder.leases[c.holderPos] = &c
	if c.requestID != "" {
		f.byRequest.replace(keyOf(&c), l, &c)
	}
	return &c
}
