/*
Package raftlog is the durable storage behind a node's raft log: entries,
HardState, ConfState and snapshots, kept in one bbolt file. Storage implements
go.etcd.io/raft/v3's raft.Storage, answering exactly as raft's MemoryStorage
does, and adds the write side a Ready loop needs.

# Basics

Open a data directory with the node's identity; the first Open creates
<dir>/raft.db, later ones check that it belongs to the same cluster and node:

	s, err := raftlog.Open(dir, raftlog.Identity{ClusterID: cid, NodeID: nid})
	if err != nil {
		return err // ErrCorrupt, ErrIdentityMismatch, ErrLocked, or I/O
	}
	defer s.Close()

Hand s to raft as Config.Storage. For each Ready, persist before sending or
applying anything:

	if err := s.Save(rd.HardState, rd.Entries, rd.Snapshot); err != nil {
		return err // the node must stop: raft's state is ahead of the disk
	}

Save writes the snapshot (if any), the entries (replacing any stored suffix
they overlap) and the HardState (if any) in one bbolt transaction, so one
Ready costs one commit. Once the application has applied far enough it calls
CreateSnapshot and then Compact to bound the log.

ReadIdentity lets a server learn the identity recorded in a directory before
it opens it.

# What it promises

  - Save, Compact, CreateSnapshot and ApplySnapshot are atomic and durable:
    when they return nil, the change has been fsynced; when they return an
    error, neither the file nor the in-memory view has changed. After a crash
    the log reopens as a consecutive prefix of what was written, containing
    everything whose Save returned, with the HardState saved alongside it.
  - The read methods answer like MemoryStorage holding the same history,
    including its errors: raft.ErrCompacted, raft.ErrUnavailable and
    raft.ErrSnapOutOfDate are returned unwrapped, because raft compares them
    with ==. Where MemoryStorage panics (an index past the log, a gap in
    appended entries) Storage returns an error wrapping ErrOutOfRange.
  - Term, FirstIndex, LastIndex and InitialState are answered from memory;
    only Entries and Snapshot read the file.
  - Open either returns a Storage whose every stored record has been read
    and checked, or an error. It never panics, never hangs on a damaged
    file, and never starts empty over a file that exists: an empty, foreign,
    truncated or damaged file is ErrCorrupt, naming the file.
  - A second Open of the same directory, from this or another process, fails
    with ErrLocked after about a second instead of blocking.

# Caveats

A Storage is safe for concurrent use, but writes take an exclusive lock for
the whole transaction, fsync included, so readers wait behind a Save.

ApplySnapshot (and Save with a snapshot) drops every stored entry, not just
those up to the snapshot index, exactly like MemoryStorage.ApplySnapshot:
raft only installs a snapshot its log does not already match.

Compact and CreateSnapshot are independent, as in MemoryStorage: a snapshot
does not compact the log, and the log may be compacted past the snapshot
(which the application should avoid, since followers that fall behind then
need a snapshot that no longer covers the gap).

Open reads the whole file, so it takes time proportional to the log's size;
compact regularly.

Snapshot data is held in the file and returned in full by Snapshot; it suits
state machines of up to tens of megabytes, not more.

# File layout

raft.db is a bbolt file (bbolt keeps its own page checksums only for its two
meta pages; every value below is therefore stored behind a 4-byte
big-endian CRC-32C of the rest, written as "sealed"). Buckets:

	meta
	    "format"     uint32 big-endian, the layout version (1)
	    "identity"   sealed 16 bytes: ClusterID, NodeID, big-endian
	    "hardstate"  sealed raftpb.HardState; absent until one is saved
	    "snapmeta"   sealed raftpb.SnapshotMetadata (index, term, ConfState)
	snapshot
	    "data"       sealed snapshot payload; absent when the snapshot has none
	entries
	    8-byte big-endian index -> sealed raftpb.Entry

The entries bucket holds consecutive indexes. Its lowest key is the "dummy"
entry at the offset (the last compacted or snapshotted index, 0 in a fresh
file): only its term is used, answering Term(FirstIndex()-1). A fresh file
holds the dummy entry {Index: 0, Term: 0} and an empty snapshot.

The file is created under a temporary name and linked into place, so raft.db
is never seen half-initialised. bbolt's freelist is not persisted (it is
rebuilt on open). Before bbolt reads an existing file, Open checks its page
structure independently (see pagecheck.go), because bbolt trusts its pages
and can fault or recurse without end on damaged ones.
*/
package raftlog
