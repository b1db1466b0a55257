package lessor

import "math/bits"

// timerSlab holds the lessor's timers, one for each lease the node holds, and finds them by token.
//
// The timers sit in fixed-size chunks, so that the scans over every lease (the leader's idle-checkpoint
// scan every CheckpointInterval/4, a takeover's deadlines, a stall's extension) read memory in order.
// Allocated one by one and visited through a token map, each timer was a cache miss: at a million leases
// the checkpoint scan held the Ready loop 81-95 ms every 1.25 s.
//
// A chunk is never moved or shrunk, so a *leaseTimer stays valid for the slab's life; a freed slot is
// zeroed (token 0: no lease has it, tokens are log indexes) and reused. Whoever keeps a timer pointer
// across the lessor's lock (a renewal batch between its check and its renewal) must therefore check that
// the slot still holds its lease's token (leaseTimer.holds). A slab that became mostly free is replaced
// by a fresh one (lessor.compactTimers), so a node that once held a million leases does not keep their
// slots; that changes the lessor's gen, and a renewal batch looks its leases up again.
//
// The token index is an open-addressing hash table (linear probing) of slot numbers: 4 bytes a bucket,
// at most three quarters of them used, so 5-11 bytes a lease where a map[uint64]*leaseTimer cost 24-38
// (measured at 100,000 and 1M leases), and no pointer for the garbage collector to follow. A bucket needs
// no copy of the token: it is read from the slot. The index is split into indexTables tables by the
// hash's top byte, each grown and shrunk on its own, so a resize rehashes a few thousand slots at a
// million leases where one table of all of them held the Ready loop 47 ms (the worst add measured over a
// million is now 2-3 ms, a new chunk or the collector). Sizing the tables up front for a rebuild (a
// restart's reset, a compaction), as the FSM's request index does, was measured and is slower here —
// filling a million dense tokens 143 → 190 ms: a table that grows stays in the cache while it fills,
// and rehashing slot numbers costs little, where the request index rehashes strings through pointers.
//
// Why not a Go map of token to slot beside the chunks: BenchmarkTimerSlabMemory (the heap after a
// collection) measured it at 1M timers at 37.8 B a timer against this index's 8.4 (the whole slab 109.8
// against 80.5 B; the lessor in BenchmarkLessorLookup 127.6 against 98.2 B a lease), 27.1 against 6.0 at
// 700,000 and 23.7 against 10.5 at 100,000. The 29 B a lease more at a million is 7 % of the 400 B of
// RSS a held lease that docs/benchmarks.md targets there: more than the simpler code is worth.
type timerSlab struct {
	chunks [][]leaseTimer
	next   int      // the first never-used slot of the last chunk
	free   []uint32 // freed slots, reused first
	live   int
	index  [indexTables]slotTable
}

// slotTable is one table of the token index: slot+1 for each timer in use, 0 in an empty bucket. Its
// length is a power of two, 1<<(64-shift), or 0 before its first timer.
type slotTable struct {
	buckets []uint32
	shift   uint8
	live    int
}

const (
	indexTables     = 256 // chosen by the hash's top byte (tableOf)
	minIndexBuckets = 8   // a table's smallest size
)

// slabChunk is the number of timers in a chunk: 72 KiB, a few allocations a million leases.
const slabChunk = 1024

// get returns the timer of the lease with token, or nil.
func (s *timerSlab) get(token uint64) *leaseTimer {
	if t, b, ok := s.find(token); ok {
		return s.at(t.buckets[b] - 1)
	}
	return nil
}

// add stores t, whose token no timer in use has, and returns its slot.
func (s *timerSlab) add(t leaseTimer) *leaseTimer {
	slot := s.alloc()
	p := s.at(slot)
	*p = t
	tab := s.tableOf(hashToken(t.token))
	if (tab.live+1)*4 > len(tab.buckets)*3 {
		s.rehash(tab, max(minIndexBuckets, 2*len(tab.buckets)))
	}
	s.insert(tab, slot)
	tab.live++
	s.live++
	return p
}

// remove zeroes t's slot for reuse and drops it from the index. The resource string goes with it, so
// the slab keeps no name alive.
func (s *timerSlab) remove(t *leaseTimer) {
	tab, b, ok := s.find(t.token)
	if !ok || s.at(tab.buckets[b]-1) != t {
		panic("timerSlab: removing a timer it does not hold")
	}
	slot := tab.buckets[b] - 1
	s.unlink(tab, b)
	*t = leaseTimer{}
	s.free = append(s.free, slot)
	tab.live--
	s.live--
	if len(tab.buckets) > minIndexBuckets && tab.live*8 < len(tab.buckets) {
		s.rehash(tab, len(tab.buckets)/2)
	}
}

// each calls fn for every timer in use, in slot order.
func (s *timerSlab) each(fn func(t *leaseTimer)) {
	for i, chunk := range s.chunks {
		if i == len(s.chunks)-1 {
			chunk = chunk[:s.next]
		}
		for j := range chunk {
			if t := &chunk[j]; t.token != 0 {
				fn(t)
			}
		}
	}
}

// len is the number of timers in use.
func (s *timerSlab) len() int { return s.live }

// sparse reports whether most of the slab is free slots — after a mass expiry, say — and worth moving
// into a fresh one: at least minSparseChunks chunks, under a quarter of their slots in use. The quarter
// makes compaction amortized O(1) a removal: the fresh slab must lose three quarters again first.
func (s *timerSlab) sparse() bool {
	return len(s.chunks) >= minSparseChunks && s.live < len(s.chunks)*slabChunk/4
}

// minSparseChunks: below this many chunks (640 KiB) a slab is never compacted.
const minSparseChunks = 8

// alloc returns a free slot's number.
func (s *timerSlab) alloc() uint32 {
	if n := len(s.free); n > 0 {
		slot := s.free[n-1]
		s.free = s.free[:n-1]
		return slot
	}
	if len(s.chunks) == 0 || s.next == slabChunk {
		s.chunks = append(s.chunks, make([]leaseTimer, slabChunk))
		s.next = 0
	}
	s.next++
	return uint32((len(s.chunks)-1)*slabChunk + s.next - 1)
}

func (s *timerSlab) at(slot uint32) *leaseTimer {
	return &s.chunks[slot/slabChunk][slot%slabChunk]
}

// hashToken spreads tokens over the index. Tokens are log indexes, dense and increasing; the
// multiplication by 2^64 over the golden ratio (Fibonacci hashing) spreads consecutive ones across it.
func hashToken(token uint64) uint64 { return token * fibonacci }

// fibonacci is 2^64 over the golden ratio, rounded to an odd number.
const fibonacci = 0x9e3779b97f4a7c15

// tableOf is the table of a token with hash h: its top byte.
func (s *timerSlab) tableOf(h uint64) *slotTable { return &s.index[h>>56] }

// home is the first bucket in tab of a token with hash h: the bits after the top byte.
func (tab *slotTable) home(h uint64) int { return int((h << 8) >> tab.shift) }

// find returns the table and bucket holding token's slot.
func (s *timerSlab) find(token uint64) (*slotTable, int, bool) {
	h := hashToken(token)
	tab := s.tableOf(h)
	if len(tab.buckets) == 0 || token == 0 {
		return nil, 0, false
	}
	mask := len(tab.buckets) - 1
	for b := tab.home(h); ; b = (b + 1) & mask {
		ref := tab.buckets[b]
		if ref == 0 {
			return nil, 0, false
		}
		if s.at(ref-1).token == token {
			return tab, b, true
		}
	}
}

// insert puts slot, whose timer holds its token already, in the first empty bucket of tab from its home.
func (s *timerSlab) insert(tab *slotTable, slot uint32) {
	mask := len(tab.buckets) - 1
	b := tab.home(hashToken(s.at(slot).token))
	for tab.buckets[b] != 0 {
		b = (b + 1) & mask
	}
	tab.buckets[b] = slot + 1
}

// unlink empties bucket b of tab and moves back the later buckets of its run that would no longer be
// found past the hole (deletion without tombstones, so lookups never slow down as leases come and go).
func (s *timerSlab) unlink(tab *slotTable, b int) {
	mask := len(tab.buckets) - 1
	for hole, next := b, (b+1)&mask; ; next = (next + 1) & mask {
		ref := tab.buckets[next]
		if ref == 0 {
			tab.buckets[hole] = 0
			return
		}
		// The entry at next may fill the hole unless its home lies cyclically in (hole, next].
		if home := tab.home(hashToken(s.at(ref - 1).token)); (next-home)&mask >= (next-hole)&mask {
			tab.buckets[hole] = ref
			hole = next
		}
	}
}

// rehash rebuilds tab with n buckets (a power of two).
func (s *timerSlab) rehash(tab *slotTable, n int) {
	old := tab.buckets
	tab.buckets = make([]uint32, n)
	tab.shift = uint8(64 - bits.TrailingZeros(uint(n)))
	for _, ref := range old {
		if ref != 0 {
			s.insert(tab, ref-1)
		}
	}
}

// timerHeap orders the leader's leases by when to look at them next (container/heap). A renewal only
// moves a lease's deadline later and leaves the heap alone: a lease is queued at its deadline as it was
// when queued, never later than its deadline now, and expireDue requeues one whose deadline moved on
// when that time comes. So a renewal costs no heap work (it was a sift-down through pointers at every
// renewal, the leader's largest cost under batched renewals), and a lease is requeued at most once
// per TTL. The key sits in the slice beside the pointer, so comparisons touch no lease.
type timerHeap []queuedTimer

// queuedTimer is a lease in the heap and the time it is queued at: at <= t.deadline, unless the lease is
// expiring (queued at the proposal's retry).
type queuedTimer struct {
	at mono
	t  *leaseTimer
}

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].t.heapIdx, h[j].t.heapIdx = int32(i), int32(j)
}
func (h *timerHeap) Push(x any) {
	q := x.(queuedTimer)
	q.t.heapIdx = int32(len(*h))
	*h = append(*h, q)
}
func (h *timerHeap) Pop() any {
	old := *h
	q := old[len(old)-1]
	old[len(old)-1] = queuedTimer{}
	q.t.heapIdx = -1
	*h = old[:len(old)-1]
	return q
}
