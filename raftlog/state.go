package raftlog

import "go.etcd.io/raft/v3/raftpb"

// state is the in-memory mirror of what the file holds, apart from entry
// payloads and snapshot data. Writers change a copy inside the bbolt
// transaction and install it only after the commit succeeds, so a failed
// write leaves memory and disk agreeing. hs and snap are treated as
// immutable: writers replace them, never modify them in place.
type state struct {
	terms termIndex                // terms of [offset, last]; offset is the dummy entry
	last  uint64                   // last stored index (== offset when only the dummy remains)
	hs    *raftpb.HardState        // nil until a non-empty HardState is saved
	snap  *raftpb.SnapshotMetadata // never nil; index 0 means no snapshot
}

func (s *state) offset() uint64     { return s.terms.offset() }
func (s *state) firstIndex() uint64 { return s.offset() + 1 }

// clone returns a copy whose changes cannot leak into s.
func (s *state) clone() state {
	c := *s
	c.terms = s.terms.clone()
	return c
}
