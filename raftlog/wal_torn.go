package raftlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// sectorSize is the smallest unit a disk writes whole: a write cut short
// by a power failure leaves each 512-byte sector it covers either written
// or as it was. WAL writes land on preallocated zeros (or past the end of
// the file), so "as it was" reads as zeros.
const sectorSize = 512

// tornWrite decides whether the damaged record at the start of b, at
// offset off of the last segment, is a write cut short by a crash (nil)
// or damage (the reason). Only one write is ever in flight, so a torn
// write is the last record, and it is torn the way a disk tears writes:
//
//   - nothing but zeros follows it (the preallocated tail) up to the end
//     of the file;
//   - some part of it is missing: the file ends inside it, or one of its
//     sectors is all zeros, a sector the crash kept from the disk (etcd's
//     isTornEntry makes the same test);
//   - its length is its own: if the records it holds end earlier and
//     match its checksum, the length field was damaged instead.
//
// A complete record with a flipped, zeroed or junk-filled byte has no
// missing sector, and damage in any earlier record leaves records after
// it, so both are ErrCorrupt. What this cannot tell from a torn write is
// damage inside a record that also holds a whole sector of zeros of its
// own; and a crash that wrote a record's later sectors but not its first
// is refused as damage (its header reads as the end of the records with
// data after it), never read as a shorter log.
func tornWrite(b []byte, off int64) error {
	if len(b) < recordHeaderSize {
		return nil // the file ends inside the header: an extending write cut short
	}
	length := int64(binary.BigEndian.Uint32(b))
	if length > maxRecordSize {
		return fmt.Errorf("record length %d is impossible", length)
	}
	end := recordHeaderSize + length
	if end < int64(len(b)) && !allZero(b[end:]) {
		return errors.New("more data follows it")
	}
	rec := b[:min(end, int64(len(b)))]
	if shorterRecordMatches(rec) {
		return errors.New("its length field is damaged: the records it holds end earlier and match its checksum")
	}
	if end > int64(len(b)) || hasZeroSector(rec, off) {
		return nil
	}
	return errors.New("it is complete (no sector of it is missing)")
}

// shorterRecordMatches reports whether rec's checksum matches its body cut
// at the end of one of the inner records it holds, short of its length.
func shorterRecordMatches(rec []byte) bool {
	if len(rec) <= batchHeaderSize {
		return false
	}
	stored := binary.BigEndian.Uint32(rec[4:])
	body := rec[recordHeaderSize:]
	crc := crc32.Update(0, castagnoli, body[:1])
	for p := 1; p < len(body); {
		_, _, n, err := parseRecord(body[p:])
		if err != nil || n == 0 {
			return false
		}
		crc = crc32.Update(crc, castagnoli, body[p:p+n])
		if p += n; crc == stored && p < len(body) {
			return true
		}
	}
	return false
}

// hasZeroSector reports whether a part of rec (which starts at file offset
// off) that fills one disk sector, or all of the sector rec covers, is
// all zeros.
func hasZeroSector(rec []byte, off int64) bool {
	for start := int64(0); start < int64(len(rec)); {
		next := (off+start)/sectorSize*sectorSize + sectorSize - off
		next = min(next, int64(len(rec)))
		if allZero(rec[start:next]) {
			return true
		}
		start = next
	}
	return false
}
