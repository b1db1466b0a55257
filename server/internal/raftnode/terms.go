package raftnode

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"
)

// How far ahead of this node's term a peer's term may be. raft adopts any higher term it is sent and
// persists it, and a term only grows: one forged message at a term near the top of the range left every
// node a candidate for ever, since the next term was beyond any bound. Terms grow by one per election, so
// a legitimate cluster never gets 2^32 terms ahead of one of its members (136 years of an election every
// second). Two rules follow from what must never happen:
//
//   - No term a node can be made to reach may make elections impossible. A node's next term (its own + 1)
//     is therefore always accepted: that is every election's vote request, and the way a node that
//     adopted a high term brings the others along (raft with PreVote and CheckQuorum: a follower answers
//     its leader's heartbeat at its own higher term, the leader steps down, and the next election is at
//     that term + 1). A fixed cap alone cannot give this: whatever a node can reach just below it, the
//     election after is refused.
//   - Forged messages cannot ratchet the term to the top of the range. A relative bound alone does not
//     stop that (each forged message may go the bound further), so a node accepts a jump only within an
//     allowance that grows with time, not with messages: at most maxTermJump above its current term plus
//     maxTermJump for every second it has held that term, and at most maxTermJump above the term it
//     started with plus maxTermJump for every second it has run. Reaching TermCeiling then takes 2^31
//     seconds (68 years) of forged messages (next terms aside, one a message, and a fresh allowance at
//     each restart), and a node that fell behind (it dropped a jump, or missed
//     one) is within the allowance again a few seconds after the others stop jumping: nobody is left
//     behind for good, which a fixed relative bound would do to a node the others outran by one election.
//
// TermCeiling is refused outright: raft adds one to a term without checking, and 2^63 leaves room for
// every election there will ever be.
const (
	maxTermJump    = 1 << 32
	termJumpPeriod = time.Second
	// TermCeiling also bounds the indexes a peer may send.
	TermCeiling = 1 << 63
)

// Clock reads the node's monotonic clock.
type Clock interface{ Now() time.Time }

// TermGuard decides which peer terms this node accepts (AcceptTerm). The Ready loop tells it every new
// term of the node's (Observe); the transport's goroutines ask. Safe for concurrent use.
type TermGuard struct {
	clock     Clock
	startTerm uint64
	started   time.Time
	cur       atomic.Pointer[heldTerm]
}

// heldTerm is the node's term and when the guard first saw it.
type heldTerm struct {
	term  uint64
	since time.Time
}

// NewTermGuard starts a guard for a node whose persisted term is term.
func NewTermGuard(clock Clock, term uint64) *TermGuard {
	now := clock.Now()
	g := &TermGuard{clock: clock, startTerm: term, started: now}
	g.cur.Store(&heldTerm{term: term, since: now})
	return g
}

// Observe records the node's term (the Ready loop, from raft's HardState).
func (g *TermGuard) Observe(term uint64) {
	if cur := g.cur.Load(); term != cur.term {
		g.cur.Store(&heldTerm{term: term, since: g.clock.Now()})
	}
}

// AcceptTerm reports whether a peer message at term may reach raft.
func (g *TermGuard) AcceptTerm(term uint64) bool {
	cur := g.cur.Load()
	switch {
	case term >= TermCeiling:
		return false
	case term <= cur.term+1:
		return true // the node's own term or the next election's
	}
	now := g.clock.Now()
	return term <= termAllowance(cur.term, now.Sub(cur.since)) && term <= termAllowance(g.startTerm, now.Sub(g.started))
}

// termAllowance is base + maxTermJump × (1 + whole periods in elapsed), saturating.
func termAllowance(base uint64, elapsed time.Duration) uint64 {
	periods := uint64(max(elapsed, 0) / termJumpPeriod)
	hi, jump := bits.Mul64(maxTermJump, periods+1)
	sum, carry := bits.Add64(base, jump, 0)
	if hi != 0 || carry != 0 {
		return math.MaxUint64
	}
	return sum
}
