package raftlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"google.golang.org/protobuf/proto"
)

// The file layout. See the package documentation for the full picture; these
// names are part of the on-disk format and must never change meaning.
const (
	// fileName is the data file inside the directory given to Open.
	fileName = "raft.db"

	// FileName is fileName for tools that build a data file elsewhere and move it into a directory
	// (a restore).
	FileName = fileName

	// formatVersion is written when a file is created or migrated. Bump it
	// only together with code that migrates or rejects older files.
	// Format 1 kept entries and the HardState in raft.db (see migrate.go);
	// format 2 keeps them in the WAL.
	formatVersion uint32 = 2
	formatV1      uint32 = 1
)

var (
	bucketMeta     = []byte("meta")
	bucketSnapshot = []byte("snapshot")
	bucketEntries  = []byte("entries")

	keyFormat    = []byte("format")    // uint32 big-endian
	keyIdentity  = []byte("identity")  // sealed ClusterID, NodeID (big-endian)
	keyHardState = []byte("hardstate") // sealed raftpb.HardState
	keySnapMeta  = []byte("snapmeta")  // sealed raftpb.SnapshotMetadata
	keySnapData  = []byte("data")      // sealed snapshot payload, in bucketSnapshot
	keyWALFrom   = []byte("walfrom")   // sealed walFrom: where WAL replay starts
	keyAcked     = []byte("acked")     // sealed ackMark: how far the log had got (guard.go)
)

// indexKey encodes a log index as an entries-bucket key. Big-endian keeps
// bbolt's byte order equal to index order, so a cursor walks the log in order.
func indexKey(i uint64) []byte {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], i)
	return k[:]
}

// keyIndex decodes an entries-bucket key; ok is false for any other length.
func keyIndex(k []byte) (i uint64, ok bool) {
	if len(k) != 8 {
		return 0, false
	}
	return binary.BigEndian.Uint64(k), true
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errBadChecksum is wrapped into ErrCorrupt by callers that know the key.
var errBadChecksum = errors.New("checksum mismatch")

// seal prefixes b with its CRC-32C. bbolt checksums only its meta pages, so
// without this a flipped bit in an entry would be replayed silently.
func seal(b []byte) []byte {
	out := make([]byte, 4+len(b))
	binary.BigEndian.PutUint32(out, crc32.Checksum(b, castagnoli))
	copy(out[4:], b)
	return out
}

// unseal checks and strips the checksum added by seal. The result aliases v.
func unseal(v []byte) ([]byte, error) {
	if len(v) < 4 {
		return nil, errBadChecksum
	}
	body := v[4:]
	if binary.BigEndian.Uint32(v) != crc32.Checksum(body, castagnoli) {
		return nil, errBadChecksum
	}
	return body, nil
}

// sealProto marshals m behind its checksum, in one allocation.
func sealProto(m proto.Message) ([]byte, error) {
	b := make([]byte, 4, 4+proto.Size(m))
	b, err := proto.MarshalOptions{}.MarshalAppend(b, m)
	if err != nil {
		return nil, fmt.Errorf("marshal: %w", err)
	}
	binary.BigEndian.PutUint32(b, crc32.Checksum(b[4:], castagnoli))
	return b, nil
}

// encode seals from for raft.db: seq, offset, index, term, big-endian.
func (f walFrom) encode() []byte {
	b := binary.BigEndian.AppendUint64(nil, f.seq)
	b = binary.BigEndian.AppendUint64(b, uint64(f.off))
	return seal(appendPoint(b, f.at))
}

func decodeWALFrom(v []byte) (walFrom, error) {
	b, err := unseal(v)
	if err != nil {
		return walFrom{}, fmt.Errorf("walfrom: %w", err)
	}
	if len(b) != 32 {
		return walFrom{}, fmt.Errorf("walfrom of %d bytes, want 32", len(b))
	}
	p, _, _ := decodePoint(b[16:])
	return walFrom{seq: binary.BigEndian.Uint64(b), off: int64(binary.BigEndian.Uint64(b[8:])), at: p}, nil
}
