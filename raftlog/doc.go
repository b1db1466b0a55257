/*
Package raftlog is the durable storage behind a node's raft log: entries and
the HardState in an append-only write-ahead log (WAL), and the identity,
ConfState and snapshots in one bbolt file beside it. Storage implements
go.etcd.io/raft/v3's raft.Storage, answering exactly as raft's MemoryStorage
does, and adds the write side a Ready loop needs.

# Basics

Open a data directory with the node's identity; the first Open creates
<dir>/raft.db, <dir>/acked and <dir>/wal/, later ones check that they belong to the same
cluster and node:

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

Save appends the entries (replacing any stored suffix they overlap) and the
HardState (if any) to the WAL as one batch, with one write and one
fdatasync. A Save carrying a snapshot also commits one bbolt transaction.
Once the application has applied far enough it calls CreateSnapshot and then
Compact to bound the log.

ReadIdentity lets a server learn the identity recorded in a directory before
it opens it.

# What it promises

  - Save, Compact, CreateSnapshot and ApplySnapshot are atomic and durable:
    when they return nil, the change has been fsynced; when they return an
    error, the in-memory view has not changed and the change will not be
    replayed (a failed WAL write is zeroed out again; if even that fails,
    the Storage refuses every later write until it is reopened). After a
    crash the log reopens as a consecutive prefix of what was written,
    containing everything whose Save returned, with the HardState saved
    alongside it: a write cut short by the crash is dropped whole.
  - The read methods answer like MemoryStorage holding the same history,
    including its errors: raft.ErrCompacted, raft.ErrUnavailable and
    raft.ErrSnapOutOfDate are returned unwrapped, because raft compares them
    with ==. Where MemoryStorage panics (an index past the log, a gap in
    appended entries) Storage returns an error wrapping ErrOutOfRange.
  - Term, FirstIndex, LastIndex and InitialState are answered from memory;
    only Entries and Snapshot read the files, and Entries not for the
    newest entries, which it keeps in memory (up to 4 MiB).
  - Entries returns slices the caller may append to; the entries in them
    are shared with the Storage (and, for recent ones, are the very entries
    passed to Save) and must not be modified, as with MemoryStorage. raft
    never modifies them.
  - Open either returns a Storage whose every stored record has been read
    and checked, or an error. It never panics, never hangs on a damaged
    file, and never starts empty or shorter over a log that exists: an
    empty, foreign, truncated or damaged raft.db or WAL segment is
    ErrCorrupt, naming the file (and, in a segment, the offset), and Open
    changes no file it refuses. The one damaged record it accepts is a
    torn write: the last record of the last segment, with nothing but the
    preallocated zeros after it and a part of it missing (the file ends
    inside it, or a 512-byte sector of it is all zeros: a sector the crash
    kept from the disk). That write never returned, so it is cut off.
  - The amnesia guard: the ack file keeps an acked mark, a position of
    the log (index and term) the WAL held durably and the term and vote
    of the HardState then, written after the WAL write it describes and
    before Save returns, with every Save that appends entries, installs a
    snapshot or changes the term or the vote. Open refuses (ErrShortLog,
    with ErrCorrupt) a WAL whose replay never held that position (a
    suffix raft overwrote later still counts as held) or whose HardState
    has an older term or another vote in that term. So a node never comes
    back with less than it had acknowledged or voted on: not after a disk
    lost writes, nor when its last record was damaged so that it reads as
    a torn write, nor with a stale copy of wal/. The mark costs a second
    fdatasync on those Saves.
  - A second Open of the same directory, from this or another process, fails
    with ErrLocked after about a second instead of blocking.
  - A format newer than this code knows is ErrCorrupt saying so.

# Caveats

A Storage is safe for concurrent use, but writes take an exclusive lock for
the whole write, fsync included, so readers wait behind a Save.

ApplySnapshot (and Save with a snapshot) drops every stored entry, not just
those up to the snapshot index, exactly like MemoryStorage.ApplySnapshot:
raft only installs a snapshot its log does not already match.

Compact and CreateSnapshot are independent, as in MemoryStorage: a snapshot
does not compact the log, and the log may be compacted past the snapshot
(which the application should avoid, since followers that fall behind then
need a snapshot that no longer covers the gap).

Open replays the whole WAL, so it takes time proportional to the log's size
(compact regularly) and reads one segment into memory at a time. In memory
the Storage keeps 24 bytes per entry (where its record is) and the terms,
and the newest entries up to 4 MiB (recent.go: raft reads back every entry
it commits, and with asynchronous storage writes the entry has usually left
raft's own memory by then); Entries reads older records from the segment
files (the page cache, in practice), so RSS does not grow with the log.

A torn write is told from damage by its shape (above). Damage the rule
cannot tell from one is cut off like a torn write: sectors zeroed at the
end of the last record (exactly what a crash leaves), or damage inside
the last record that also holds a whole sector of its own zeros. The
acked mark then refuses the log if that record's Save had returned. A
crash that wrote the last record's later sectors but not its first is
refused as damage: its header reads as the end of the records with data
after it.
bbolt's two meta pages must both be valid: bbolt would fall back to the
other one, one transaction back, without a word; a meta page lies inside
one sector, so no crash tears it.

Snapshot data is held in raft.db and returned in full by Snapshot; it suits
state machines of up to tens of megabytes, not more.

# File layout

<dir>/wal/<seq>.wal are the WAL segments, seq a 16-digit hex sequence number
counting up from 1 (consecutive: a missing one is ErrCorrupt). Each is
preallocated with zeros, preallocChunk at a time (4 MiB), so that
fdatasync flushes data only, and is cut once the next write would take it
past 64 MiB. Open truncates the last segment after its last good record
(durably, before appending to it, and only once the whole log has passed
every check), so nothing a crash left behind can be read as records later. A record is framed as length (uint32
big-endian), CRC-32C (Castagnoli) of type and payload, a type byte and the
payload (see wal_record.go); a length of 0 ends the records. A segment
holds a base record (its seq, the log's last index and term and the
HardState when it was cut, so it can be replayed once earlier segments are
deleted) followed by batch records, one per write, each holding framed
inner records: entries, HardStates, compactions, and a reset that starts
the log afresh at a snapshot. Positions in memory point at the inner
records, so reading an entry checks only its own checksum.

raft.db is a bbolt file (bbolt keeps its own page checksums only for its two
meta pages; every value below is therefore stored behind a 4-byte
big-endian CRC-32C of the rest, written as "sealed"). Buckets:

	meta
	    "format"     uint32 big-endian, the layout version (3)
	    "identity"   sealed 16 bytes: ClusterID, NodeID, big-endian
	    "snapmeta"   sealed raftpb.SnapshotMetadata (index, term, ConfState)
	    "walfrom"    sealed segment seq, offset, index, term (uint64 each):
	                 the batch whose reset starts the log
	    "acked"      format 2 only: the acked mark, sealed (below); Open
	                 moves it to the ack file and writes format 3
	snapshot
	    "data"       sealed snapshot payload; absent when the snapshot has none

Any other key in these buckets is ErrCorrupt: a damaged key must not read
as a missing one.

<dir>/acked is the ack file: two 512-byte slots, each a sealed sequence
number and mark (index, term, HardState term, vote; uint64 each,
big-endian), zeros after. A write goes to the slot not holding the
newest, so a torn one leaves the mark before it; the intact slot with the
higher sequence is the mark. A missing file, or one with no intact slot,
is ErrCorrupt.

Replay starts at the batch walfrom points at, or, once compaction deleted
that segment, at the base record of the first segment left, and applies
every later batch. A snapshot installation writes its batch (a reset, then
the Ready's entries and HardState) to the WAL first and then commits the
snapshot and the new walfrom in one bbolt transaction: a crash between the
two leaves a reset that walfrom does not point at, which replay treats as
the end of the log, so the installation is lost whole, never half done.
Compact writes a compaction record and then deletes the oldest segments
holding nothing above the new offset; segments before walfrom's are
superseded and deleted too.

raft.db is created under a temporary name and linked into place after the
WAL it points at and the ack file, so raft.db is never seen
half-initialised; a wal/ directory without raft.db is what an interrupted creation (or restore)
leaves, and Open replaces it. bbolt's freelist is not persisted (it is
rebuilt on open). Before bbolt reads an existing file, Open checks its page
structure independently (see pagecheck.go), because bbolt trusts its pages
and can fault or recurse without end on damaged ones.
*/
package raftlog
