package fsm

import (
	"github.com/google/btree"

	"github.com/leased/leased/api/leasepb"
)

// holderBtreeDegree is small: most holders hold few leases.
const holderBtreeDegree = 8

// Lease is a copy of one live grant, as queries and results return it.
type Lease struct {
	Resource string
	Holder   string
	// Token is the fencing token: the log index of the grant.
	Token       uint64
	TTLMs       int64
	Value       []byte
	LockDelayMs int64
	RequestID   string
	// Checkpointed is true once a checkpoint was applied to this lease; RemainingMs and Renewed are the
	// values of the last one. A fresh grant counts as renewed: a new leader gives it a full TTL.
	Checkpointed bool
	RemainingMs  int64
	Renewed      bool
}

// Proto converts the lease to its wire form. RemainingMs is left 0: only the leader's lessor knows it.
func (l Lease) Proto() *leasepb.Lease {
	return &leasepb.Lease{
		Resource:    l.Resource,
		Holder:      l.Holder,
		Token:       l.Token,
		TtlMs:       l.TTLMs,
		Value:       l.Value,
		LockDelayMs: l.LockDelayMs,
		RequestId:   l.RequestID,
	}
}

// LockDelay describes a resource that is ungrantable after an involuntary loss.
type LockDelay struct {
	Resource string
	// Token is the expired lease's token; EndLockDelay must name it.
	Token uint64
	// Index is the log index of the Expire entry that started the delay; the leader counts DelayMs from
	// when it applied that entry (or, after a leader change, from when it took over).
	Index   uint64
	DelayMs int64
}

// lease is the stored form of a grant. It is kept small: a node may hold a million of them.
// The holder name is shared by all leases of that holder.
type lease struct {
	resource    string
	holder      *holder
	token       uint64
	ttlMs       int64
	lockDelayMs int64
	remainingMs int64
	value       []byte
	requestID   string
	flags       leaseFlags
}

type leaseFlags uint8

const (
	flagCheckpointed leaseFlags = 1 << iota
	flagRenewed
)

func (l *lease) has(f leaseFlags) bool { return l.flags&f != 0 }

func (l *lease) set(f leaseFlags, on bool) {
	if on {
		l.flags |= f
	} else {
		l.flags &^= f
	}
}

func (l *lease) export() Lease {
	return Lease{
		Resource:     l.resource,
		Holder:       l.holder.name,
		Token:        l.token,
		TTLMs:        l.ttlMs,
		Value:        l.value,
		LockDelayMs:  l.lockDelayMs,
		RequestID:    l.requestID,
		Checkpointed: l.has(flagCheckpointed),
		RemainingMs:  l.remainingMs,
		Renewed:      l.has(flagRenewed),
	}
}

// holder is shared by every lease of one holder: it interns the name and indexes the holder's leases by
// resource, which serves "leases of a holder" and the per-holder limit. A tree per holder rather than one
// tree ordered by (holder, resource) keeps inserts cheap: each tree is small and mostly appended to.
type holder struct {
	name   string
	leases *btree.BTreeG[*lease]
}

func newHolder(name string) *holder {
	return &holder{name: name, leases: btree.NewG(holderBtreeDegree, lessByResource)}
}

// lockDelay is the stored form of a LockDelay.
type lockDelay struct {
	token   uint64
	index   uint64
	delayMs int64
}
