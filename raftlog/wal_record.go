package raftlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"google.golang.org/protobuf/proto"

	"go.etcd.io/raft/v3/raftpb"
)

// A WAL record is framed as
//
//	length  uint32 big-endian: len(type) + len(payload), never 0
//	crc     uint32 big-endian: CRC-32C (Castagnoli) of type and payload
//	type    1 byte, one of the rec* constants
//	payload
//
// Segments are preallocated with zeros, so a length of 0 marks the end of
// the records in a segment. The checksum covers the type so that a flipped
// type byte cannot turn an entry into a HardState.
const recordHeaderSize = 8

// recordType says what a WAL record's payload holds. These values are part
// of the on-disk format and must never change meaning.
type recordType byte

const (
	// recBase opens every segment: its sequence number and the log's last
	// index, that index's term and the HardState when the segment was cut,
	// so a segment can be replayed once the ones before it are deleted.
	// Payload: seq, last, lastTerm (uint64 big-endian each), then the
	// marshalled HardState (empty when none has been saved).
	recBase recordType = 1
	// recReset replaces the whole log with the single dummy entry (index,
	// term): a snapshot installation or the start of a log. It counts only
	// where raft.db's walfrom record points at it. Payload: index, term,
	// then the HardState in effect, as in recBase.
	recReset recordType = 2
	// recEntry is a marshalled raftpb.Entry. An entry at or below the last
	// index replaces the stored suffix from its index on.
	recEntry recordType = 3
	// recHardState is a marshalled raftpb.HardState.
	recHardState recordType = 4
	// recCompact makes (index, term) the new dummy entry, dropping every
	// entry before it. Payload: index, term.
	recCompact recordType = 5
	// recBatch holds the records of one write (one Save, Compact or
	// snapshot installation), each framed as above. Its checksum covers
	// them all, so a write cut short by a crash is dropped whole: a Save's
	// entries never survive without its HardState. Every record after a
	// segment's recBase is inside a recBatch.
	recBatch recordType = 6
)

// batchHeaderSize is a recBatch record's framing: header and type byte.
// Writers reserve it at the start of their buffer (newBatch) and fill it
// in once the inner records are known (sealBatch).
const batchHeaderSize = recordHeaderSize + 1

// newBatch returns a buffer with room for a recBatch header.
func newBatch() []byte {
	b := make([]byte, batchHeaderSize, 4096)
	b[recordHeaderSize] = byte(recBatch)
	return b
}

// sealBatch fills in the recBatch header of a buffer from newBatch.
func sealBatch(b []byte) {
	body := b[recordHeaderSize:]
	binary.BigEndian.PutUint32(b, uint32(len(body)))
	binary.BigEndian.PutUint32(b[4:], crc32.Checksum(body, castagnoli))
}

// maxRecordSize bounds a record's declared length, so a damaged length
// field cannot make replay allocate gigabytes.
const maxRecordSize = 1 << 30

var errTornRecord = errors.New("incomplete or damaged record")

// appendRecord frames payload as a record of type t at the end of buf.
func appendRecord(buf []byte, t recordType, payload []byte) []byte {
	start := len(buf)
	buf = binary.BigEndian.AppendUint32(buf, uint32(1+len(payload)))
	buf = binary.BigEndian.AppendUint32(buf, 0)
	buf = append(buf, byte(t))
	buf = append(buf, payload...)
	crc := crc32.Checksum(buf[start+recordHeaderSize:], castagnoli)
	binary.BigEndian.PutUint32(buf[start+4:], crc)
	return buf
}

// appendProtoRecord frames a marshalled message without an extra copy.
func appendProtoRecord(buf []byte, t recordType, m proto.Message) ([]byte, error) {
	start := len(buf)
	buf = append(buf, make([]byte, recordHeaderSize+1)...)
	buf[start+recordHeaderSize] = byte(t)
	buf, err := proto.MarshalOptions{}.MarshalAppend(buf, m)
	if err != nil {
		return nil, fmt.Errorf("marshal: %w", err)
	}
	body := buf[start+recordHeaderSize:]
	binary.BigEndian.PutUint32(buf[start:], uint32(len(body)))
	binary.BigEndian.PutUint32(buf[start+4:], crc32.Checksum(body, castagnoli))
	return buf, nil
}

// parseRecord reads the record at the start of b. It returns n == 0 with a
// nil error at the end of the records (a zero length); errTornRecord when
// the record is cut short or fails its checksum.
func parseRecord(b []byte) (t recordType, payload []byte, n int, err error) {
	if len(b) < recordHeaderSize {
		if allZero(b) {
			return 0, nil, 0, nil
		}
		return 0, nil, 0, errTornRecord
	}
	length := binary.BigEndian.Uint32(b)
	if length == 0 {
		return 0, nil, 0, nil
	}
	if length > maxRecordSize || uint64(len(b)-recordHeaderSize) < uint64(length) {
		return 0, nil, 0, errTornRecord
	}
	body := b[recordHeaderSize : recordHeaderSize+int(length)]
	if binary.BigEndian.Uint32(b[4:]) != crc32.Checksum(body, castagnoli) {
		return 0, nil, 0, errTornRecord
	}
	return recordType(body[0]), body[1:], recordHeaderSize + int(length), nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// point is a log position with its term: the payload of recCompact, the
// head of recBase and recReset.
type point struct{ index, term uint64 }

func appendPoint(buf []byte, p point) []byte {
	buf = binary.BigEndian.AppendUint64(buf, p.index)
	return binary.BigEndian.AppendUint64(buf, p.term)
}

func decodePoint(b []byte) (point, []byte, error) {
	if len(b) < 16 {
		return point{}, nil, fmt.Errorf("record payload of %d bytes, want at least 16", len(b))
	}
	return point{binary.BigEndian.Uint64(b), binary.BigEndian.Uint64(b[8:])}, b[16:], nil
}

// marshalHardState encodes hs for recBase and recReset; nil encodes empty.
func marshalHardState(hs *raftpb.HardState) ([]byte, error) {
	if hs == nil {
		return nil, nil
	}
	b, err := proto.Marshal(hs)
	if err != nil {
		return nil, fmt.Errorf("marshal hardstate: %w", err)
	}
	return b, nil
}

// decodeHardState is marshalHardState's inverse: empty decodes to nil.
func decodeHardState(b []byte) (*raftpb.HardState, error) {
	if len(b) == 0 {
		return nil, nil
	}
	hs := &raftpb.HardState{}
	if err := proto.Unmarshal(b, hs); err != nil {
		return nil, fmt.Errorf("hardstate: %w", err)
	}
	return hs, nil
}

// baseRecord builds the payload of a segment's opening recBase record.
func baseRecord(seq uint64, last point, hs *raftpb.HardState) ([]byte, error) {
	hsb, err := marshalHardState(hs)
	if err != nil {
		return nil, err
	}
	b := binary.BigEndian.AppendUint64(nil, seq)
	b = appendPoint(b, last)
	return appendRecord(nil, recBase, append(b, hsb...)), nil
}

// appendReset appends a recReset record to buf.
func appendReset(buf []byte, p point, hs *raftpb.HardState) ([]byte, error) {
	hsb, err := marshalHardState(hs)
	if err != nil {
		return nil, err
	}
	return appendRecord(buf, recReset, append(appendPoint(nil, p), hsb...)), nil
}

// decodeBase splits a recBase payload.
func decodeBase(b []byte) (seq uint64, last point, hs *raftpb.HardState, err error) {
	if len(b) < 8 {
		return 0, point{}, nil, fmt.Errorf("base record of %d bytes", len(b))
	}
	seq = binary.BigEndian.Uint64(b)
	last, rest, err := decodePoint(b[8:])
	if err != nil {
		return 0, point{}, nil, err
	}
	hs, err = decodeHardState(rest)
	return seq, last, hs, err
}
