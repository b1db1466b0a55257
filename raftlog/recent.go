package raftlog

import (
	"google.golang.org/protobuf/proto"

	"go.etcd.io/raft/v3/raftpb"
)

// The newest entries stay in memory, so that raft, which reads back every entry it commits (with
// asynchronous storage writes an entry has usually left raft's own unstable log by then), is answered
// without a read and a decode of the WAL. The cache is a suffix of the log, bounded in bytes, kept in the
// state with the same copy-on-write discipline as pos: a writer appends past the installed copy's length
// or reallocates, so a failed write leaves the installed cache as it was.

// maxRecentBytes bounds the cache (entries' proto sizes).
const maxRecentBytes = 4 << 20

// recentFirst is the index of the cache's first entry (last+1 when it is empty).
func (s *state) recentFirst() uint64 { return s.last + 1 - uint64(len(s.recent)) }

// cacheAppend records ents, which the writer stores from index start on (replacing entries from start),
// before st.last moves to their end; size is their proto size (the writer has just marshalled them). The
// caller has already trimmed ents to start.
func (s *state) cacheAppend(start uint64, ents []*raftpb.Entry, size int) {
	if first := s.recentFirst(); start < first || start > s.last+1 {
		s.recent, s.recentBytes = nil, 0 // not contiguous with the cache: start a new one
	} else if keep := int(start - first); keep < len(s.recent) {
		s.recentBytes -= sizeOf(s.recent[keep:])
		s.recent = append(make([]*raftpb.Entry, 0, keep+len(ents)), s.recent[:keep]...) // never write the shared array
	}
	s.recent = append(s.recent, ents...)
	s.recentBytes += size
	for len(s.recent) > 1 && s.recentBytes > maxRecentBytes {
		s.recentBytes -= proto.Size(s.recent[0])
		s.recent = s.recent[1:]
	}
}

// cacheCompact drops cached entries at or below the new offset i.
func (s *state) cacheCompact(i uint64) {
	if first := s.recentFirst(); len(s.recent) > 0 && i >= first {
		n := min(int(i-first+1), len(s.recent))
		s.recentBytes -= sizeOf(s.recent[:n])
		s.recent = s.recent[n:]
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
	ents := s.recent[lo-first : hi-first]
	if maxSize >= uint64(s.recentBytes) { // the whole cache fits: no need to size each entry
		return ents[:len(ents):len(ents)], true
	}
	size := uint64(proto.Size(ents[0]))
	n := 1
	for ; n < len(ents); n++ {
		size += uint64(proto.Size(ents[n]))
		if size > maxSize {
			break
		}
	}
	return ents[:n:n], true
}

func sizeOf(ents []*raftpb.Entry) int {
	n := 0
	for _, e := range ents {
		n += proto.Size(e)
	}
	return n
}
