package raftlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/leased/leased/internal/fileutil"
)

// ackFileName is the amnesia guard's file beside raft.db (guard.go). It is
// not in wal/, so a stale copy of wal/ put back over a newer one is still
// measured against it.
const ackFileName = "acked"

// AckFileName is ackFileName for tools that build a data dir elsewhere and
// move it into place (a restore).
const AckFileName = ackFileName

// The file holds two slots of one sector each; a write goes to the slot
// not holding the newest mark, so a write torn by a crash damages only the
// slot it was writing, and the other still holds the mark before it (whose
// Save had returned: nothing after it was acknowledged). A slot is a
// sealed sequence number and mark; the one with the higher sequence wins.
const (
	ackSlotSize = 512
	ackSlots    = 2
	ackBodySize = 8 + 32 // sequence, ackMark
)

// ackFile is the open file and the sequence number of its newest slot.
type ackFile struct {
	f    *os.File
	path string
	seq  uint64
}

// createAckFile writes dir's ack file afresh holding m, durably (the file
// and its directory entry), and leaves it open.
func createAckFile(dir string, m ackMark) (*ackFile, error) {
	path := filepath.Join(dir, ackFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", path, err)
	}
	a := &ackFile{f: f, path: path}
	if err := f.Truncate(ackSlotSize * ackSlots); err == nil {
		err = a.record(m)
	}
	if err == nil {
		err = fileutil.SyncDir(dir)
	}
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("create %s: %w", path, err)
	}
	return a, nil
}

// openAckFile opens dir's ack file and returns its newest mark. A missing
// file, one of another size, or one with no intact slot is ErrCorrupt
// naming it: losing the mark must not switch the guard off.
func openAckFile(dir string) (*ackFile, ackMark, error) {
	path := filepath.Join(dir, ackFileName)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ackMark{}, corruptf(path, "missing: it records how far this node's log had got")
	}
	if err != nil {
		return nil, ackMark{}, fmt.Errorf("raftlog: open %s: %w", path, err)
	}
	a := &ackFile{f: f, path: path}
	m, err := a.load()
	if err != nil {
		_ = f.Close()
		return nil, ackMark{}, err
	}
	return a, m, nil
}

// load reads both slots and keeps the newest intact one.
func (a *ackFile) load() (ackMark, error) {
	buf := make([]byte, ackSlotSize*ackSlots+1)
	n, err := io.ReadFull(a.f, buf)
	switch {
	case err != nil && !errors.Is(err, io.ErrUnexpectedEOF):
		return ackMark{}, fmt.Errorf("raftlog: read %s: %w", a.path, err)
	case n != ackSlotSize*ackSlots:
		return ackMark{}, corruptf(a.path, "%d bytes, want %d", n, ackSlotSize*ackSlots)
	}
	var best ackMark
	for i := range ackSlots {
		seq, m, ok := decodeAckSlot(buf[i*ackSlotSize : (i+1)*ackSlotSize])
		if ok && seq > a.seq {
			a.seq, best = seq, m
		}
	}
	if a.seq == 0 {
		return ackMark{}, corruptf(a.path, "neither of its two records is intact")
	}
	return best, nil
}

// decodeAckSlot decodes one slot; ok is false for a damaged or unused one.
// The bytes after the sealed body must be zeros, so that damage there is
// not ignored either (the slot then does not count).
func decodeAckSlot(slot []byte) (seq uint64, m ackMark, ok bool) {
	sealed := slot[:4+ackBodySize]
	if !allZero(slot[len(sealed):]) {
		return 0, ackMark{}, false
	}
	body, err := unseal(sealed)
	if err != nil {
		return 0, ackMark{}, false
	}
	seq = binary.BigEndian.Uint64(body)
	m, err = decodeRawAckMark(body[8:])
	return seq, m, err == nil && seq != 0
}

// record durably writes m into the older slot. It is one sector write and
// one fdatasync: the file's size never changes, so no metadata is flushed.
func (a *ackFile) record(m ackMark) error {
	seq := a.seq + 1
	body := binary.BigEndian.AppendUint64(nil, seq)
	body = append(body, m.raw()...)
	slot := make([]byte, ackSlotSize)
	copy(slot, seal(body))
	if _, err := a.f.WriteAt(slot, int64(seq%ackSlots)*ackSlotSize); err != nil {
		return fmt.Errorf("write %s: %w", a.path, err)
	}
	if err := fdatasync(a.f); err != nil {
		return fmt.Errorf("sync %s: %w", a.path, err)
	}
	a.seq = seq
	return nil
}

func (a *ackFile) close() error { return a.f.Close() }
