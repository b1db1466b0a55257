package raftlog

import "go.etcd.io/raft/v3/raftpb"

// state is the in-memory mirror of what the log holds, apart from entry
// payloads and snapshot data. Writers change a copy and install it only
// after the write is durable, so a failed write leaves memory and disk
// agreeing. hs and snap are treated as immutable: writers replace them,
// never modify them in place.
type state struct {
	terms termIndex                // terms of [offset, last]; offset is the dummy entry
	last  uint64                   // last stored index (== offset when only the dummy remains)
	hs    *raftpb.HardState        // nil until a non-empty HardState is saved
	snap  *raftpb.SnapshotMetadata // never nil; index 0 means no snapshot
	// pos[i-offset-1] locates entry i's WAL record. Writers never write
	// into the shared prefix: they append past len (invisible to the old
	// copy) or copy before truncating (see setPos).
	pos []entryPos
	// recent caches the newest entries, a suffix of the log ending at last (recent.go); recentSizes
	// are their proto sizes, recentBytes the sum.
	recent      []*raftpb.Entry
	recentSizes []int32
	recentBytes int
}

func (s *state) offset() uint64     { return s.terms.offset() }
func (s *state) firstIndex() uint64 { return s.offset() + 1 }

// clone returns a copy whose changes cannot leak into s. pos is shared:
// the copy only appends beyond s's length or reallocates (setPos).
func (s *state) clone() state {
	c := *s
	c.terms = s.terms.clone()
	return c
}

// setPos records entry i's position; i is at most last+1.
func (s *state) setPos(i uint64, p entryPos) {
	k := int(i - s.offset() - 1)
	if k < len(s.pos) {
		s.pos = append(append(make([]entryPos, 0, k+1024), s.pos[:k]...), p)
		return
	}
	s.pos = append(s.pos, p)
}

// compactPos drops the positions of entries at or below the new offset i;
// call it before terms.compact moves the offset.
func (s *state) compactPos(i uint64) {
	s.pos = s.pos[i-s.offset():]
}

// point returns index i with its term; offset <= i <= last.
func (s *state) point(i uint64) point { return point{i, s.terms.term(i)} }
