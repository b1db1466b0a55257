package raftlog

import "go.etcd.io/raft/v3/raftpb"

// The newest entries stay in memory, so that raft, which reads back every entry it commits (with
// asynchronous storage writes an entry has usually left raft's own unstable log by then), is answered
// without a read and a decode of the WAL. The cache is a suffix of the log, bounded in bytes, kept in the
// state with the same copy-on-write discipline as pos: a writer appends past the installed copy's length
// or reallocates, so a failed write leaves the installed cache as it was.

// maxRecentBytes bounds the cache's memory: the entries' proto sizes (kept beside them in recentSizes so
// that nothing sizes an entry twice) plus recentEntryOverhead each.
const maxRecentBytes = 4 << 20

// recentEntryOverhead is roughly what a cached entry costs beyond its proto size: the 96-byte Entry
// struct, its separately allocated Term and Index, its data's rounding to a size class, and its slots in
// recent and recentSizes. Small entries (an acquire is about 100 bytes) cost twice their size or more, so
// counting proto sizes alone held 2–3× the bound (heap profile at 100,000 leases: 14.5 MB of entries).
const recentEntryOverhead = 128

// recentCost is the cache's memory as maxRecentBytes counts it.
func (s *state) recentCost() int { return s.recentBytes + len(s.recent)*recentEntryOverhead }

// recentFirst is the index of the cache's first entry (last+1 when it is empty).
func (s *state) recentFirst() uint64 { return s.last + 1 - uint64(len(s.recent)) }

// cacheAppend records ents, which the writer stores from index start on (replacing entries from start),
// before st.last moves to their end; sizes are their proto sizes (the writer has just marshalled them).
// The caller has already trimmed ents to start.
func (s *state) cacheAppend(start uint64, ents []*raftpb.Entry, sizes []int32) {
	if first := s.recentFirst(); start < first || start > s.last+1 {
		s.recent, s.recentSizes, s.recentBytes = nil, nil, 0 // not contiguous with the cache: start a new one
	} else if keep := int(start - first); keep < len(s.recent) {
		s.recentBytes -= sum(s.recentSizes[keep:])
		// Never write the shared arrays: the installed state may still use them.
		s.recent = append(make([]*raftpb.Entry, 0, keep+len(ents)), s.recent[:keep]...)
		s.recentSizes = append(make([]int32, 0, keep+len(ents)), s.recentSizes[:keep]...)
	}
	s.recent = append(s.recent, ents...)
	s.recentSizes = append(s.recentSizes, sizes...)
	s.recentBytes += sum(sizes)
	for len(s.recent) > 1 && s.recentCost() > maxRecentBytes {
		s.recentBytes -= int(s.recentSizes[0])
		s.recent, s.recentSizes = s.recent[1:], s.recentSizes[1:]
	}
}

// cacheCompact drops cached entries at or below the new offset i.
func (s *state) cacheCompact(i uint64) {
	if first := s.recentFirst(); len(s.recent) > 0 && i >= first {
		n := min(int(i-first+1), len(s.recent))
		s.recentBytes -= sum(s.recentSizes[:n])
		s.recent, s.recentSizes = s.recent[n:], s.recentSizes[n:]
	}
}

// cached returns [lo, hi) from the cache, limited to maxSize as MemoryStorage limits (at least one
// entry), if the cache holds all of it. The slice's capacity is its length: raft appends to what
// Entries returns, which must not write into the cache.
func (s *state) cached(lo, hi, maxSize uint64) ([]*raftpb.Entry, bool) {
	first := s.recentFirst()
	if lo < first || hi > s.last+1 || lo >= hi {
		return nil, false
	}
	ents, sizes := s.recent[lo-first:hi-first], s.recentSizes[lo-first:hi-first]
	if maxSize >= uint64(s.recentBytes) { // the whole cache fits: no need to add up sizes
		return ents[:len(ents):len(ents)], true
	}
	size := uint64(sizes[0])
	n := 1
	for ; n < len(ents); n++ {
		size += uint64(sizes[n])
		if size > maxSize {
			break
		}
	}
	return ents[:n:n], true
}

func sum(sizes []int32) int {
	n := 0
	for _, v := range sizes {
		n += int(v)
	}
	return n
}
