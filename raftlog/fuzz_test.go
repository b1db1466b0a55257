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

// FuzzReopenCorrupted damages a valid log file (fuzzer-chosen bytes at
// fuzzer-chosen offsets, optionally truncated) and reopens it. Open must
// return a working Storage or an error wrapping ErrCorrupt that names the
// file; it must not panic or hang, and neither may using what it returned.
//
// edits is read as 5-byte groups: a 4-byte big-endian offset (taken modulo
// the part of the file bbolt has used, so no effort goes into free space at
// the end) and a byte XORed into the file there. truncate, if not zero, cuts
// the file to truncate modulo its size.
func FuzzReopenCorrupted(f *testing.F) {
	f.Add([]byte{}, uint32(0))
	f.Add([]byte{0, 0, 0, 20, 0xff}, uint32(0))      // meta 0 magic
	f.Add([]byte{0, 0, 0x30, 0, 0x01}, uint32(0))    // a page header
	f.Add([]byte{}, uint32(9000))                    // truncated mid-file
	f.Add([]byte{0, 0, 0x40, 0x20, 0x80}, uint32(0)) // element area
	f.Fuzz(func(t *testing.T, edits []byte, truncate uint32) {
		img := corruptImage(templateFile(t), edits, truncate)
		dir := t.TempDir()
		path := filepath.Join(dir, fileName)
		if err := os.WriteFile(path, img, 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := Open(dir, testID)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrIdentityMismatch) {
				t.Fatalf("Open: %v, want ErrCorrupt", err)
			}
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("Open error %q does not name %s", err, path)
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

// corruptImage applies the fuzzer's edits to a copy of img.
func corruptImage(img, edits []byte, truncate uint32) []byte {
	img = append([]byte(nil), img...)
	used := uint32(len(img))
	if m := decodeMeta(img); m.valid && m.pgid*uint64(m.pageSize) < uint64(used) {
		used = uint32(m.pgid) * m.pageSize
	}
	for ; len(edits) >= 5; edits = edits[5:] {
		off := binary.BigEndian.Uint32(edits) % used
		img[off] ^= edits[4]
	}
	if truncate != 0 {
		img = img[:truncate%uint32(len(img))]
	}
	return img
}

var template struct {
	once sync.Once
	img  []byte
	err  error
}

// templateFile returns the bytes of a valid log with a compacted prefix, a
// snapshot, a HardState and enough entries to need branch pages.
func templateFile(t *testing.T) []byte {
	template.once.Do(func() { template.img, template.err = buildTemplate() })
	if template.err != nil {
		t.Fatalf("building template: %v", template.err)
	}
	return template.img
}

func buildTemplate() ([]byte, error) {
	dir, err := os.MkdirTemp("", "raftlog-fuzz")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	s, err := Open(dir, testID)
	if err != nil {
		return nil, err
	}
	for i := uint64(1); i <= 400; i += 50 {
		if err := s.Save(hardState(2, 1, i), entries(i, i+50, 2), nil); err != nil {
			return nil, err
		}
	}
	cs := &raftpb.ConfState{Voters: []uint64{1, 2, 3}}
	if _, err := s.CreateSnapshot(300, cs, []byte("state machine at 300")); err != nil {
		return nil, err
	}
	if err := s.Compact(250); err != nil {
		return nil, err
	}
	if err := s.Close(); err != nil {
		return nil, err
	}
	return os.ReadFile(filepath.Join(dir, fileName))
}
