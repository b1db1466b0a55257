package fsm

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/google/btree"
	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
)

// Sentinel errors. Apply returns them only for faults of the caller (the server), never for a command that
// is merely refused: refusals are Result codes, because every node must apply them identically.
var (
	// ErrIndexNotIncreasing: entries must be applied in strictly increasing index order.
	ErrIndexNotIncreasing = errors.New("fsm: index not increasing")
	// ErrUnknownCommand: the entry holds no command this version knows. The node must stop rather than
	// diverge from nodes that do know it.
	ErrUnknownCommand = errors.New("fsm: unknown command")
	// ErrDecode: the entry's bytes are not a Command.
	ErrDecode = errors.New("fsm: cannot decode command")
)

// btreeDegree trades memory for depth; 32 keeps a million leases about four levels deep.
const btreeDegree = 32

// FSM is the lease state machine. The zero value is not usable; call New or Restore.
type FSM struct {
	applied uint64
	// highest is the largest token ever granted (it survives the lease's end).
	highest uint64
	// byResource holds every live lease, ordered by resource, then slot: at most one plain lease per
	// resource, or at most its limit of semaphore slots (I2; semaphore.go).
	byResource *btree.BTreeG[entry]
	// semaphores counts the live slots of each semaphore resource (semaphore.go).
	semaphores map[string]*semaphore
	// holders indexes the same leases by holder; each holder keeps its own leases ordered by resource.
	holders map[string]*holder
	delays  map[string]lockDelay
	// identities counts the live leases of each identity, in all and per holder label (identities.go).
	identities map[string]*identityUse
	// ends remembers the last MaxRememberedEnds lease ends (ends.go), so a retried Release learns that
	// its first attempt took effect.
	ends endLog
	// byRequest indexes the live leases granted under a request id by their dedup key (requests.go).
	byRequest requestIndex
	// answered remembers recent acquire intents refused or ended, to refuse their stale attempts
	// (attempts.go).
	answered answeredLog
	// acl holds the ACL rules, read-only once set; aclSet says whether rules were ever set (acl.go).
	acl    []*leasepb.AclRule
	aclSet bool
	// members is the member table by raft id, removed the ids ever removed (members.go).
	members map[uint64]*leasepb.Member
	removed map[uint64]bool
	// clusterID and generation say which cluster this state belongs to and how many restores are
	// behind it (lineage.go).
	clusterID, generation uint64
	// epoch counts the views taken (view.go); it may wrap: only equality is asked of it.
	epoch uint32
	// liveViews counts the views taken and not yet released (View.Release). While it is 0 no view shares
	// a lease, and writable changes leases in place. Atomic: a view is released on the goroutine that
	// encoded it.
	liveViews atomic.Int32
	// key is a search key for find, kept so that the lookup every applied command makes allocates
	// nothing: a key is a lease (the tree's generic code lets it escape), and that garbage made the
	// collector run often enough at a million leases to cost a checkpoint's apply half again. Taken by
	// swapping it out, since readers may search while holding only a read lock.
	key atomic.Pointer[lease]
}

// New returns an empty state machine.
func New() *FSM {
	return &FSM{
		byResource: btree.NewG(btreeDegree, lessEntry),
		holders:    make(map[string]*holder),
		identities: make(map[string]*identityUse),
		delays:     make(map[string]lockDelay),
		ends:       newEndLog(),
		byRequest:  newRequestIndex(),
		answered:   newAnsweredLog(),
		semaphores: make(map[string]*semaphore),
		members:    make(map[uint64]*leasepb.Member),
		removed:    make(map[uint64]bool),
	}
}

// entry is a B-tree item: the lease alone, ordered by resource and then slot (0 for a plain lease, the
// token for a semaphore slot: lease.slotKey). An item of 8 bytes where the name and slot beside the
// pointer made 32: BenchmarkMemoryPerLease at a million leases 221 -> 171 bytes a lease (the tree's
// nodes are about half full when names come in order). A comparison reads the name through the lease,
// one more cache miss at that size: a random lookup among a million 2.5 -> 3.8-4.0 µs (BenchmarkLookup),
// a mass checkpoint's or expiry's apply 5-20 % slower (docs/benchmarks.md, "Memory per held lease").
type entry struct{ *lease }

func lessEntry(a, b entry) bool {
	if a.resource != b.resource {
		return a.resource < b.resource
	}
	return a.slotKey() < b.slotKey()
}

// probe is a search key for the tree: the place of a lease on resource with slot.
func probe(resource string, slot uint64) entry {
	k := new(lease)
	k.becomeKey(resource, slot)
	return entry{k}
}

// becomeKey makes k a search key for the place (resource, slot).
func (k *lease) becomeKey(resource string, slot uint64) {
	*k = lease{resource: resource, token: slot}
	if slot > 0 {
		k.limit = 1 // a semaphore slot's slotKey is its token
	}
}

// find returns the lease at (resource, slot).
func (f *FSM) find(resource string, slot uint64) (*lease, bool) {
	k := f.key.Swap(nil)
	if k == nil {
		k = new(lease)
	}
	k.becomeKey(resource, slot)
	e, ok := f.byResource.Get(entry{k})
	k.resource = "" // keep no name alive
	f.key.Store(k)
	return e.lease, ok
}

// ApplyEntry decodes one log entry's data and applies it. See Apply.
func (f *FSM) ApplyEntry(index uint64, data []byte) (Result, error) {
	cmd, err := DecodeCommand(data)
	if err != nil {
		return Result{}, err
	}
	return f.Apply(index, cmd)
}

// DecodeCommand parses a log entry's data.
func DecodeCommand(data []byte) (*wirepb.Command, error) {
	cmd := new(wirepb.Command)
	if err := proto.Unmarshal(data, cmd); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrDecode, err)
	}
	return cmd, nil
}

// EncodeCommand is the inverse of DecodeCommand.
func EncodeCommand(cmd *wirepb.Command) ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(cmd)
}

// Apply applies the command of the entry at index. Indexes must strictly increase; the error is non-nil
// only for an out-of-order index or an unknown command, and then nothing changed.
func (f *FSM) Apply(index uint64, cmd *wirepb.Command) (Result, error) {
	if index <= f.applied {
		return Result{}, fmt.Errorf("%w: got %d after %d", ErrIndexNotIncreasing, index, f.applied)
	}
	var res Result
	switch op := cmd.GetOp().(type) {
	case *wirepb.Command_Acquire:
		res = f.acquireAttempt(index, op.Acquire)
	case *wirepb.Command_Release:
		res = f.release(index, op.Release)
	case *wirepb.Command_Expire:
		res = f.expire(index, op.Expire)
	case *wirepb.Command_Checkpoint:
		res = f.checkpoint(op.Checkpoint)
	case *wirepb.Command_Renew:
		res = f.renew(op.Renew)
	case *wirepb.Command_EndLockDelay:
		res = f.endLockDelay(op.EndLockDelay)
	case *wirepb.Command_SetAcl:
		res = f.setACL(op.SetAcl)
	case *wirepb.Command_Proclaim:
		res = f.proclaim(index, op.Proclaim)
	case *wirepb.Command_ReleaseHandoff:
		res = f.releaseHandoff(index, op.ReleaseHandoff)
	default:
		return Result{}, fmt.Errorf("%w at index %d", ErrUnknownCommand, index)
	}
	f.applied = index
	return res, nil
}

// Advance records that the entry at index carried no command (an empty entry of a new leader, or a
// configuration change), so that AppliedIndex and snapshots reflect it.
func (f *FSM) Advance(index uint64) error {
	if index <= f.applied {
		return fmt.Errorf("%w: got %d after %d", ErrIndexNotIncreasing, index, f.applied)
	}
	f.applied = index
	return nil
}

// AppliedIndex is the index of the last entry applied.
func (f *FSM) AppliedIndex() uint64 { return f.applied }

// HighestToken is the largest token ever granted; every later grant's token is larger.
func (f *FSM) HighestToken() uint64 { return f.highest }

// Len is the number of live leases (each semaphore slot counts as one).
func (f *FSM) Len() int { return f.byResource.Len() }

// Get returns the live lease on resource; for a semaphore, its oldest slot (see Slots).
func (f *FSM) Get(resource string) (Lease, bool) {
	l, ok := f.lookup(resource)
	if !ok {
		if _, sem := f.semaphores[resource]; !sem {
			return Lease{}, false
		}
		l = f.oldestSlot(resource)
	}
	return l.export(), true
}

// Current returns the lease (resource, token) if token is a current grant of resource: its plain lease
// or one of its semaphore slots.
func (f *FSM) Current(resource string, token uint64) (Lease, bool) {
	l, ok := f.current(resource, token)
	if !ok {
		return Lease{}, false
	}
	return l.export(), true
}

// IsCurrent reports whether token is a current grant of resource (its lease, or one of its slots).
func (f *FSM) IsCurrent(resource string, token uint64) bool {
	_, ok := f.current(resource, token)
	return ok
}

// LockDelayOf returns the lock-delay a resource is in, if any.
func (f *FSM) LockDelayOf(resource string) (LockDelay, bool) {
	d, ok := f.delays[resource]
	if !ok {
		return LockDelay{}, false
	}
	return d.export(resource), true
}

// LockDelays returns every resource in its lock-delay, in resource order.
func (f *FSM) LockDelays() []LockDelay {
	out := make([]LockDelay, 0, len(f.delays))
	for _, r := range sortedKeys(f.delays) {
		out = append(out, f.delays[r].export(r))
	}
	return out
}

func (d lockDelay) export(resource string) LockDelay {
	return LockDelay{Resource: resource, Token: d.token, Index: d.index, DelayMs: d.delayMs}
}

// List returns up to limit leases whose resource starts with prefix and that sort after the lease
// (after, afterSlot) (after empty: from the start), in resource then token order, and whether more
// follow. afterSlot is the token of a semaphore slot the previous page ended with, 0 after a plain lease.
func (f *FSM) List(prefix, after string, afterSlot uint64, limit int) ([]Lease, bool) {
	pivot := probe(prefix, 0)
	if after != "" && after >= prefix {
		// Begin strictly after the last lease of the previous page.
		pivot = probe(after+"\x00", 0)
		if afterSlot > 0 {
			pivot = probe(after, afterSlot+1)
		}
	}
	return collect(f.byResource, pivot, limit, func(e entry) bool {
		return strings.HasPrefix(e.resource, prefix)
	})
}

// ListHolder is List for the leases of one holder: up to limit of them whose resource starts with prefix
// and that sort after (after, afterSlot), in resource then token order, and whether more matches follow.
// The prefix is applied while scanning, before the page is cut, so a page is only ever short at the end
// of the matches.
func (f *FSM) ListHolder(holderName, prefix, after string, afterSlot uint64, limit int) ([]Lease, bool) {
	h, ok := f.holders[holderName]
	if !ok {
		return nil, false
	}
	var page []*lease
	pivot := probe(after, afterSlot)
	for _, l := range h.leases {
		if (after == "" || lessEntry(pivot, entry{l})) && strings.HasPrefix(l.resource, prefix) {
			page = append(page, l)
		}
	}
	slices.SortFunc(page, func(a, b *lease) int {
		if c := strings.Compare(a.resource, b.resource); c != 0 {
			return c
		}
		return cmp.Compare(a.slotKey(), b.slotKey())
	})
	more := len(page) > limit
	if more {
		page = page[:limit]
	}
	out := make([]Lease, len(page))
	for i, l := range page {
		out[i] = l.export()
	}
	return out, more
}

// HolderCount is the number of live leases of a holder.
func (f *FSM) HolderCount(holderName string) int {
	if h, ok := f.holders[holderName]; ok {
		return len(h.leases)
	}
	return 0
}

// Ascend calls fn for every live lease in resource order until fn returns false.
func (f *FSM) Ascend(fn func(Lease) bool) {
	f.byResource.Ascend(func(e entry) bool { return fn(e.lease.export()) })
}

// collect walks tree from pivot while match holds, gathering at most limit leases.
func collect(tree *btree.BTreeG[entry], pivot entry, limit int, match func(entry) bool) ([]Lease, bool) {
	var out []Lease
	more := false
	tree.AscendGreaterOrEqual(pivot, func(e entry) bool {
		if !match(e) {
			return false
		}
		if len(out) == limit {
			more = true
			return false
		}
		out = append(out, e.lease.export())
		return true
	})
	return out, more
}

// lookup returns the plain lease on resource (not a semaphore slot).
func (f *FSM) lookup(resource string) (*lease, bool) {
	return f.find(resource, 0)
}

// current returns the lease (resource, token) if token is a current grant of resource: its plain lease,
// or one of its semaphore slots.
func (f *FSM) current(resource string, token uint64) (*lease, bool) {
	if l, ok := f.lookup(resource); ok {
		if l.token != token {
			return nil, false
		}
		return l, true
	}
	if token == 0 {
		return nil, false
	}
	return f.find(resource, token)
}
