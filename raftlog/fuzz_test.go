package raftlog

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

// FuzzReopenCorrupted damages a valid log (fuzzer-chosen bytes at
// fuzzer-chosen offsets of raft.db or the WAL segments, raft.db optionally
// truncated) and reopens it. Open must return a working Storage or an error
// wrapping ErrCorrupt that names the damaged file; it must not panic or
// hang, and neither may using what it returned.
//
// edits is read as 5-byte groups: a 4-byte big-endian offset and a byte
// XORed into the log there. The offset is taken modulo the bytes in use:
// first the part of raft.db bbolt has used (so no effort goes into free
// space at its end), then the segments' records, in order. truncate, if
// not zero, cuts raft.db to truncate modulo its size.
func FuzzReopenCorrupted(f *testing.F) {
	f.Add([]byte{}, uint32(0))
	f.Add([]byte{0, 0, 0, 20, 0xff}, uint32(0))      // meta 0 magic
	f.Add([]byte{0, 0, 0x30, 0, 0x01}, uint32(0))    // a page header
	f.Add([]byte{}, uint32(9000))                    // truncated mid-file
	f.Add([]byte{0, 0, 0x40, 0x20, 0x80}, uint32(0)) // element area
	f.Fuzz(func(t *testing.T, edits []byte, truncate uint32) {
		img, wal, damaged := corruptLog(templateFile(t), templateWAL(t), edits, truncate)
		dir := t.TempDir()
		path := filepath.Join(dir, fileName)
		if err := os.WriteFile(path, img, 0o600); err != nil {
			t.Fatal(err)
		}
		writeSegments(t, dir, wal)
		if err := os.WriteFile(filepath.Join(dir, ackFileName), template.ack, 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := Open(dir, testID)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrIdentityMismatch) {
				t.Fatalf("Open: %v, want ErrCorrupt", err)
			}
			if !namesDamagedFile(err, dir, damaged) {
				t.Fatalf("Open error %q does not name a damaged file (%v)", err, damaged)
			}
			return
		}
		exerciseStorage(t, s)
	})
}

// exerciseStorage reads everything and writes a little; errors are allowed
// (a reopened file may lack entries the template had), panics are not.
func exerciseStorage(t *testing.T, s *Storage) {
	defer func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	first, _ := s.FirstIndex()
	last, _ := s.LastIndex()
	_, _, _ = s.InitialState()
	_, _ = s.Snapshot()
	for i := first - 1; i <= last; i++ {
		_, _ = s.Term(i)
	}
	if last >= first {
		if _, err := s.Entries(first, last+1, 1<<20); err != nil {
			t.Fatalf("Entries on a file Open accepted: %v", err)
		}
	}
	_ = s.Save(hardState(9, 1, last), entries(last+1, last+4, 9), nil)
	_ = s.Compact(last)
}

// corruptLog applies the fuzzer's edits to copies of img (raft.db) and
// wal (segment contents by sequence number), returning which files it
// changed: fileName and segment names.
func corruptLog(img []byte, wal [][]byte, edits []byte, truncate uint32) ([]byte, [][]byte, []string) {
	img = append([]byte(nil), img...)
	used := uint32(len(img))
	if m := decodeMeta(img); m.valid && m.pgid*uint64(m.pageSize) < uint64(used) {
		used = uint32(m.pgid) * m.pageSize
	}
	segs := make([][]byte, len(wal))
	total := used
	for i, b := range wal {
		segs[i] = append([]byte(nil), b...)
		total += uint32(len(b))
	}
	var damaged []string
	for ; len(edits) >= 5; edits = edits[5:] {
		off := binary.BigEndian.Uint32(edits) % total
		if off < used {
			img[off] ^= edits[4]
			damaged = append(damaged, fileName)
			continue
		}
		off -= used
		for i := range segs {
			if off < uint32(len(segs[i])) {
				segs[i][off] ^= edits[4]
				damaged = append(damaged, segmentName(uint64(i+1)))
				break
			}
			off -= uint32(len(segs[i]))
		}
	}
	if truncate != 0 {
		img = img[:truncate%uint32(len(img))]
		damaged = append(damaged, fileName)
	}
	return img, segs, damaged
}

// namesDamagedFile reports whether err names a file in dir that was
// damaged; a damaged raft.db may also surface as a WAL segment raft.db
// no longer matches, so any name in dir counts then.
func namesDamagedFile(err error, dir string, damaged []string) bool {
	msg := err.Error()
	for _, name := range damaged {
		if name == fileName && strings.Contains(msg, dir) {
			return true
		}
		if strings.Contains(msg, filepath.Join(dir, walDirName, name)) {
			return true
		}
	}
	return false
}

// writeSegments writes wal's segments (sequence numbers from 1, empty for
// one compaction deleted) into dir.
func writeSegments(t *testing.T, dir string, wal [][]byte) {
	t.Helper()
	walDir := filepath.Join(dir, walDirName)
	if err := os.MkdirAll(walDir, 0o700); err != nil {
		t.Fatal(err)
	}
	for i, b := range wal {
		if len(b) == 0 {
			continue // deleted by compaction
		}
		if err := os.WriteFile(filepath.Join(walDir, segmentName(uint64(i+1))), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

var template struct {
	once sync.Once
	img  []byte
	wal  [][]byte // segment contents up to their last record, from seq 1
	ack  []byte   // the ack file
	err  error
}

// templateFile returns the bytes of a valid log with a compacted prefix, a
// snapshot, a HardState and enough entries to need branch pages.
func templateFile(t *testing.T) []byte {
	template.once.Do(func() { template.img, template.wal, template.err = buildTemplate() })
	if template.err != nil {
		t.Fatalf("building template: %v", template.err)
	}
	return template.img
}

// templateWAL returns the WAL segments of the template log.
func templateWAL(t *testing.T) [][]byte {
	templateFile(t)
	return template.wal
}

func buildTemplate() ([]byte, [][]byte, error) {
	img, wal, err := buildTemplateDir()
	return img, wal, err
}

// buildTemplateDir writes the template log, then reads raft.db and the
// segments (cut after their last record, so the fuzzer spends no effort
// on preallocated zeros; Open accepts such segments) back.
func buildTemplateDir() ([]byte, [][]byte, error) {
	dir, err := os.MkdirTemp("", "raftlog-fuzz")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(dir)
	if err := writeTemplateLog(dir); err != nil {
		return nil, nil, err
	}
	img, err := os.ReadFile(filepath.Join(dir, fileName))
	if err != nil {
		return nil, nil, err
	}
	if template.ack, err = os.ReadFile(filepath.Join(dir, ackFileName)); err != nil {
		return nil, nil, err
	}
	seqs, err := listSegments(filepath.Join(dir, walDirName))
	if err != nil {
		return nil, nil, err
	}
	var wal [][]byte
	for seq := uint64(1); seq <= seqs[len(seqs)-1]; seq++ {
		b, err := os.ReadFile(filepath.Join(dir, walDirName, segmentName(seq)))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, nil, err
		}
		wal = append(wal, b[:recordsEnd(b)])
	}
	return img, wal, nil
}

// recordsEnd is where the records in a segment's bytes end.
func recordsEnd(b []byte) int {
	off := 0
	for {
		_, _, n, err := parseRecord(b[off:])
		if err != nil || n == 0 {
			return off
		}
		off += n
	}
}

func writeTemplateLog(dir string) error {
	s, err := Open(dir, testID)
	if err != nil {
		return err
	}
	for i := uint64(1); i <= 400; i += 50 {
		if err := s.Save(hardState(2, 1, i), entries(i, i+50, 2), nil); err != nil {
			return err
		}
	}
	cs := &raftpb.ConfState{Voters: []uint64{1, 2, 3}}
	if _, err := s.CreateSnapshot(300, cs, []byte("state machine at 300")); err != nil {
		return err
	}
	if err := s.Compact(250); err != nil {
		return err
	}
	return s.Close()
}
