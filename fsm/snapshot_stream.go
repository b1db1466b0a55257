package fsm

import (
	"fmt"
	"unicode/utf8"

	"github.com/google/btree"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/wirepb"
)

// The leases are nearly all of a snapshot (a million of them at the design's scale), so they are encoded
// and decoded one record at a time, straight between the FSM and the snapshot's bytes: no message per
// lease is built for the whole state at once, which at a million leases was some 200 MB of garbage on
// every snapshot and every restore, and a second copy of the encoded body. The bytes are exactly what
// proto.MarshalOptions{Deterministic: true}.Marshal of the whole SnapshotBody gives
// (TestStreamedSnapshotIsTheProtoEncoding): its fields in number order, applied_index and highest_token,
// then the leases (field 3), then the rest, each encoded as protobuf does.

// snapshotLeasesField is SnapshotBody.leases' field number.
const snapshotLeasesField protowire.Number = 3

// encodeBody appends a SnapshotBody to buf: head holds fields 1 and 2, leases field 3, rest the fields
// after it.
func encodeBody(buf []byte, head *wirepb.SnapshotBody, leases *btree.BTreeG[entry], rest *wirepb.SnapshotBody) ([]byte, error) {
	opts := proto.MarshalOptions{Deterministic: true}
	buf, err := opts.MarshalAppend(buf, head)
	if err != nil {
		return nil, err
	}
	leases.Ascend(func(e entry) bool {
		buf = protowire.AppendTag(buf, snapshotLeasesField, protowire.BytesType)
		buf = protowire.AppendVarint(buf, uint64(e.lease.recordSize()))
		buf = e.lease.appendRecord(buf)
		return true
	})
	return opts.MarshalAppend(buf, rest)
}

// leasesSize is the encoded size of every lease record, with its tag and length.
func leasesSize(leases *btree.BTreeG[entry]) int {
	n := 0
	leases.Ascend(func(e entry) bool {
		s := e.lease.recordSize()
		n += protowire.SizeTag(snapshotLeasesField) + protowire.SizeBytes(s)
		return true
	})
	return n
}

// The LeaseRecord fields, by number (api/proto/leased/internal/v1/fsm.proto).
const (
	recResource     protowire.Number = 1
	recHolder       protowire.Number = 2
	recToken        protowire.Number = 3
	recTTLMs        protowire.Number = 4
	recValue        protowire.Number = 5
	recLockDelayMs  protowire.Number = 6
	recRequestID    protowire.Number = 7
	recCheckpointed protowire.Number = 8
	recRemainingMs  protowire.Number = 9
	recRenewed      protowire.Number = 10
	recIdentity     protowire.Number = 20
	recLimit        protowire.Number = 60
	recProclaimed   protowire.Number = 61
)

// appendRecord appends l's LeaseRecord as proto3 encodes it: fields in number order, zero values left out.
func (l *lease) appendRecord(b []byte) []byte {
	b = appendString(b, recResource, l.resource)
	b = appendString(b, recHolder, l.holder.name)
	b = appendVarint(b, recToken, l.token)
	b = appendVarint(b, recTTLMs, uint64(l.ttlMs))
	b = appendString(b, recValue, l.value)
	b = appendVarint(b, recLockDelayMs, uint64(l.lockDelayMs))
	b = appendString(b, recRequestID, l.requestID)
	b = appendBool(b, recCheckpointed, l.has(flagCheckpointed))
	b = appendVarint(b, recRemainingMs, uint64(l.remainingMs))
	b = appendBool(b, recRenewed, l.has(flagRenewed))
	b = appendString(b, recIdentity, l.identity)
	b = appendVarint(b, recLimit, uint64(l.limit))
	return appendBool(b, recProclaimed, l.has(flagProclaimed))
}

// recordSize is the length of appendRecord's output.
func (l *lease) recordSize() int {
	return sizeString(recResource, l.resource) + sizeString(recHolder, l.holder.name) +
		sizeVarint(recToken, l.token) + sizeVarint(recTTLMs, uint64(l.ttlMs)) +
		sizeString(recValue, l.value) + sizeVarint(recLockDelayMs, uint64(l.lockDelayMs)) +
		sizeString(recRequestID, l.requestID) + sizeBool(recCheckpointed, l.has(flagCheckpointed)) +
		sizeVarint(recRemainingMs, uint64(l.remainingMs)) + sizeBool(recRenewed, l.has(flagRenewed)) +
		sizeString(recIdentity, l.identity) + sizeVarint(recLimit, uint64(l.limit)) +
		sizeBool(recProclaimed, l.has(flagProclaimed))
}

func appendString(b []byte, n protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	return protowire.AppendString(protowire.AppendTag(b, n, protowire.BytesType), s)
}

func appendVarint(b []byte, n protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, n, protowire.VarintType), v)
}

func appendBool(b []byte, n protowire.Number, v bool) []byte {
	if !v {
		return b
	}
	return appendVarint(b, n, 1)
}

func sizeString(n protowire.Number, s string) int {
	if s == "" {
		return 0
	}
	return protowire.SizeTag(n) + protowire.SizeBytes(len(s))
}

func sizeVarint(n protowire.Number, v uint64) int {
	if v == 0 {
		return 0
	}
	return protowire.SizeTag(n) + protowire.SizeVarint(v)
}

func sizeBool(n protowire.Number, v bool) int {
	if !v {
		return 0
	}
	return protowire.SizeTag(n) + 1
}

// decodeBody is proto.Unmarshal of a SnapshotBody that leaves the lease records encoded: body holds every
// other field, leases the records where they lie in payload, for fromBody to decode one at a time. A
// malformed body is an error.
func decodeBody(payload []byte) (body *wirepb.SnapshotBody, leases leaseRecords, err error) {
	var rest []byte
	start, end := -1, 0
	for off := 0; off < len(payload); {
		n, m, err := consumeField(payload[off:])
		if err != nil {
			return nil, leaseRecords{}, err
		}
		if isLeaseRecord(payload[off:]) {
			if start < 0 {
				start = off
			}
			end = off + n + m
		} else {
			rest = append(rest, payload[off:off+n+m]...)
		}
		off += n + m
	}
	if start >= 0 {
		leases.span = payload[start:end]
	}
	body = new(wirepb.SnapshotBody)
	if err := proto.Unmarshal(rest, body); err != nil {
		return nil, leaseRecords{}, err
	}
	return body, leases, nil
}

// leaseRecords are a snapshot body's encoded lease records, left where they lie: span runs from the
// first to the last of them (our encoder writes them together; another field between them is skipped,
// decodeBody having taken it). Not collecting them in a slice spares a restore 24 bytes of garbage a
// lease and the slice's regrowth.
type leaseRecords struct {
	span []byte
}

// each calls fn with every record's index and bytes, in order, until fn returns an error.
func (r leaseRecords) each(fn func(i int, rec []byte) error) error {
	for off, i := 0, 0; off < len(r.span); {
		n, m, err := consumeField(r.span[off:])
		if err != nil {
			return err // decodeBody parsed this span already
		}
		if isLeaseRecord(r.span[off:]) {
			rec, _ := protowire.ConsumeBytes(r.span[off+n:])
			if err := fn(i, rec); err != nil {
				return err
			}
			i++
		}
		off += n + m
	}
	return nil
}

// consumeField parses the field at the start of b: n bytes of tag, m of value.
func consumeField(b []byte) (n, m int, err error) {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 {
		return 0, 0, protowire.ParseError(n)
	}
	m = protowire.ConsumeFieldValue(num, typ, b[n:])
	if m < 0 {
		return 0, 0, protowire.ParseError(m)
	}
	return n, m, nil
}

// isLeaseRecord reports whether the well-formed field at the start of b is one of SnapshotBody.leases.
func isLeaseRecord(b []byte) bool {
	num, typ, _ := protowire.ConsumeTag(b)
	return num == snapshotLeasesField && typ == protowire.BytesType
}

// record is a LeaseRecord as decodeRecord reads it, without a message: the strings a lease keeps are
// converted once, the holder's name and the identity stay bytes (a restore only looks the holder up by
// its name, and converts the identity only when it is not the holder's previous one), and nothing is
// allocated that the lease does not keep.
type record struct {
	resource, requestID               string
	holder, identity, value           []byte
	token                             uint64
	ttlMs, lockDelayMs, remainingMs   int64
	limit                             uint32
	checkpointed, renewed, proclaimed bool
}

// decodeRecord is proto.Unmarshal of a LeaseRecord into r, which it resets first. It accepts and refuses
// what proto.Unmarshal does (TestDecodeRecordIsProtoUnmarshal): fields in any order, a repeated field's
// last value, unknown fields and known ones of another wire type skipped, a string that is not UTF-8
// refused. proto.Unmarshal allocated every string, the holder's name too, and was a fifth of a restore.
func decodeRecord(b []byte, r *record) error {
	*r = record{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var m int
		switch typ {
		case protowire.BytesType:
			var v []byte
			if v, m = protowire.ConsumeBytes(b); m >= 0 {
				if err := r.setBytes(num, v); err != nil {
					return err
				}
			}
		case protowire.VarintType:
			var v uint64
			if v, m = protowire.ConsumeVarint(b); m >= 0 {
				r.setVarint(num, v)
			}
		default:
			m = protowire.ConsumeFieldValue(num, typ, b)
		}
		if m < 0 {
			return protowire.ParseError(m)
		}
		b = b[m:]
	}
	return nil
}

// setBytes sets the length-delimited field num to v; unknown numbers are skipped.
func (r *record) setBytes(num protowire.Number, v []byte) error {
	switch num {
	case recResource, recHolder, recRequestID, recIdentity:
		if !utf8.Valid(v) {
			return fmt.Errorf("field %d: string field contains invalid UTF-8", num)
		}
	}
	switch num {
	case recResource:
		r.resource = string(v)
	case recHolder:
		r.holder = v
	case recValue:
		r.value = v
	case recRequestID:
		r.requestID = string(v)
	case recIdentity:
		r.identity = v
	}
	return nil
}

// setVarint sets the varint field num to v, as protobuf converts it to the field's type; unknown numbers
// are skipped.
func (r *record) setVarint(num protowire.Number, v uint64) {
	switch num {
	case recToken:
		r.token = v
	case recTTLMs:
		r.ttlMs = int64(v)
	case recLockDelayMs:
		r.lockDelayMs = int64(v)
	case recRemainingMs:
		r.remainingMs = int64(v)
	case recLimit:
		r.limit = uint32(v)
	case recCheckpointed:
		r.checkpointed = v != 0
	case recRenewed:
		r.renewed = v != 0
	case recProclaimed:
		r.proclaimed = v != 0
	}
}
