package raftlog

import "errors"

// Sentinel errors. Functions in this package wrap them with context (the file
// path, the offending index), so test for them with errors.Is. The Storage
// methods that implement raft.Storage also return raft's own sentinels
// (raft.ErrCompacted, raft.ErrUnavailable, raft.ErrSnapOutOfDate), wrapped or
// bare, with the meaning raft gives them.
var (
	// ErrCorrupt means the log exists but cannot be trusted: raft.db is not
	// a bbolt file, its pages (or one of its two meta pages) are damaged,
	// it lacks this package's buckets, holds keys it does not know or has
	// an unknown format version, or a record in it or in a WAL segment
	// fails its checksum or does not fit the log. The one damaged record
	// that is not ErrCorrupt is a write cut short by a crash at the end of
	// the last segment (see the package documentation). Open never starts empty over such a
	// log; an operator has to move it aside.
	ErrCorrupt = errors.New("raft log file is corrupt")

	// ErrShortLog means the WAL holds less than raft.db records this node
	// had durably logged (a position in its log, its term, its vote): the
	// disk lost writes it had acknowledged, or wal/ was replaced by an older
	// copy. The node may have voted or acknowledged entries on the strength
	// of what is missing, so it must not take part in elections again with
	// this log. Open returns it together with ErrCorrupt (errors.Is matches
	// both); the member has to be replaced.
	ErrShortLog = errors.New("raft log is shorter than this node acknowledged")

	// ErrIdentityMismatch means the data file was created for a different
	// cluster or node than the one opening it. Starting anyway would let one
	// node vote twice under two names, so Open refuses.
	ErrIdentityMismatch = errors.New("raft log belongs to another cluster or node")

	// ErrLocked means another Storage, in this process or another, holds the
	// data file open; Open gave up after a short wait rather than hang.
	ErrLocked = errors.New("raft log file is locked by another process")

	// ErrClosed is returned by every method called after Close.
	ErrClosed = errors.New("raft log is closed")

	// ErrOutOfRange means an index argument lies beyond the stored log (Compact
	// or CreateSnapshot past LastIndex, Save leaving a gap after LastIndex), or
	// that the entries handed to Save are not consecutive. raft's
	// MemoryStorage panics in these cases; this package returns the error.
	ErrOutOfRange = errors.New("index out of range of the stored log")
)
