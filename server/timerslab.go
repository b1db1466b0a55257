package server

// timerSlab holds the lessor's timers in fixed-size chunks, so that the scans over every lease (the
// leader's idle-checkpoint scan every CheckpointInterval/4, a takeover's deadlines, a stall's extension)
// read memory in order. Allocated one by one and visited through the token map, each timer was a cache
// miss: at a million leases the checkpoint scan held the Ready loop 81-95 ms every 1.25 s.
//
// A chunk is never moved or shrunk, so a *leaseTimer stays valid for the slab's life; a freed slot is
// zeroed (token 0: no lease has it, tokens are log indexes) and reused. Whoever keeps a timer pointer
// across the lessor's lock (a renewal batch between its check and its renewal) must therefore check that
// the slot still holds its lease's token (leaseTimer.holds). A slab that became mostly free is replaced
// by a fresh one (lessor.compactTimers), so a node that once held a million leases does not keep their
// slots; that changes the lessor's gen, and a renewal batch looks its leases up again.
type timerSlab struct {
	chunks [][]leaseTimer
	next   int           // the first never-used slot of the last chunk
	free   []*leaseTimer // freed slots, reused first
	live   int
}

// slabChunk is the number of timers in a chunk: 80 KiB, a few allocations a million leases.
const slabChunk = 1024

// alloc returns a zeroed slot.
func (s *timerSlab) alloc() *leaseTimer {
	s.live++
	if n := len(s.free); n > 0 {
		t := s.free[n-1]
		s.free = s.free[:n-1]
		return t
	}
	if len(s.chunks) == 0 || s.next == slabChunk {
		s.chunks = append(s.chunks, make([]leaseTimer, slabChunk))
		s.next = 0
	}
	t := &s.chunks[len(s.chunks)-1][s.next]
	s.next++
	return t
}

// release zeroes t's slot for reuse. The resource string goes with it, so the slab keeps no name alive.
func (s *timerSlab) release(t *leaseTimer) {
	*t = leaseTimer{}
	s.free = append(s.free, t)
	s.live--
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
