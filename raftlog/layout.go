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

	// formatVersion is written when a file is created. Bump it only together
	// with code that migrates or rejects older files. Format 2 keeps entries
	// and the HardState in the WAL; format 3 moves the acked mark from
	// raft.db into the ack file (ackfile.go), and Open migrates a format 2
	// directory to it. No released build wrote another.
	formatVersion uint32 = 3

	// formatLegacyMark is format 2, whose raft.db holds the acked mark.
	formatLegacyMark uint32 = 2
)

var (
	bucketMeta     = []byte("meta")
	bucketSnapshot = []byte("snapshot")

	keyFormat   = []byte("format")   // uint32 big-endian
	keyIdentity = []byte("identity") // sealed ClusterID, NodeID (big-endian)
	keySnapMeta = []byte("snapmeta") // sealed raftpb.SnapshotMetadata
	keySnapData = []byte("data")     // sealed snapshot payload, in bucketSnapshot
	keyWALFrom  = []byte("walfrom")  // sealed walFrom: where WAL replay starts
	keyAcked    = []byte("acked")    // format 2: sealed ackMark, now in the ack file (guard.go)
)

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
