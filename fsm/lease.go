package fsm

import "github.com/leased/leased/api/leasepb"

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
	// Identity is the authenticated identity that holds the lease ("" when granted without client
	// certificates). Only it, or an identity with admin on the resource, renews or releases the lease.
	Identity string
	// Limit is the semaphore's number of slots when the lease is one of its slots; 0 for a plain lease.
	Limit uint32
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
		Identity:    l.Identity,
		Limit:       l.Limit,
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

// lease is the stored form of a grant. It is kept small: a node may hold a million of them. Its 109 bytes
// fit the runtime's 112-byte size class (it was 128) because the value is a string and the TTL and
// lock-delay are 32-bit milliseconds (MaxDurationMs); lease_test.go keeps it there.
// The holder name is shared by all leases of that holder.
type lease struct {
	resource    string
	holder      *holder
	token       uint64
	remainingMs int64
	value       string
	requestID   string
	identity    string
	ttlMs       int32
	lockDelayMs int32
	holderPos   int32  // position in holder.leases
	limit       uint32 // the semaphore's slot count for a slot, 0 for a plain lease
	flags       leaseFlags
	// epoch is FSM.epoch when this lease was made: older, a View may share it (writable; view.go).
	// It sits in what was padding.
	epoch uint32
}

type leaseFlags uint8

const (
	flagCheckpointed leaseFlags = 1 << iota
	flagRenewed
	// flagProclaimed: a Proclaim replaced the value the lease was granted with, so a retried Acquire is
	// no longer compared on it (requests.go).
	flagProclaimed
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
		TTLMs:        int64(l.ttlMs),
		Value:        bytesOf(l.value),
		LockDelayMs:  int64(l.lockDelayMs),
		RequestID:    l.requestID,
		Identity:     l.identity,
		Limit:        l.limit,
		Checkpointed: l.has(flagCheckpointed),
		RemainingMs:  l.remainingMs,
		Renewed:      l.has(flagRenewed),
	}
}

// holder is shared by every lease of one holder: it interns the name and lists the holder's leases, which
// serves "leases of a holder" and the per-holder limit. The list is unordered (insert and remove are O(1),
// on the apply path); ListHolder sorts what it returns, off the apply path.
type holder struct {
	name   string
	leases []*lease
	// identity is that of the holder's latest grant, whose bytes its next grants share (sharedIdentity).
	identity string
}

func newHolder(name string) *holder { return &holder{name: name} }

func (h *holder) add(l *lease) {
	l.holderPos = int32(len(h.leases))
	h.leases = append(h.leases, l)
}

// sharedIdentity returns id, as the same string as the identity of the holder's previous grant when the
// two are equal: a holder's leases nearly always come from one client certificate, and each would
// otherwise keep its own copy of the name (16 or 24 bytes for typical names, with authentication on).
// Which copy a lease keeps changes nothing it answers.
func (h *holder) sharedIdentity(id string) string {
	if id != h.identity {
		h.identity = id
	}
	return h.identity
}

// sharedIdentityBytes is sharedIdentity of a name not yet converted (a restore's record): converted only
// when it is not the previous grant's.
func (h *holder) sharedIdentityBytes(id []byte) string {
	if string(id) != h.identity {
		h.identity = string(id)
	}
	return h.identity
}

func (h *holder) remove(l *lease) {
	last := h.leases[len(h.leases)-1]
	h.leases[l.holderPos] = last
	last.holderPos = l.holderPos
	h.leases[len(h.leases)-1] = nil
	h.leases = h.leases[:len(h.leases)-1]
}

// lockDelay is the stored form of a LockDelay.
type lockDelay struct {
	token   uint64
	index   uint64
	delayMs int64
}

// MaxDurationMs is the longest TTL or lock-delay a lease stores, in milliseconds (about 24.8 days): the
// server refuses a longer --max-ttl or --max-lock-delay. An entry asking for more (no server of this
// version proposes one) is stored as this: every node applies the same saturation.
const MaxDurationMs = 1<<31 - 1

// durationMs is ms as a lease stores it.
func durationMs(ms int64) int32 { return int32(min(max(ms, 0), MaxDurationMs)) }

// bytesOf returns a copy of s, nil when empty, as Lease.Value has always been.
func bytesOf(s string) []byte {
	if s == "" {
		return nil
	}
	return []byte(s)
}
