package raftlog

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/leased/leased/internal/fileutil"
)

// walDirName is the directory, inside the data dir, holding the segments.
const walDirName = "wal"

// WALDirName is walDirName for tools that build a data dir elsewhere and
// move it into place (a restore).
const WALDirName = walDirName

// Segment sizing. A segment is cut once the next write would take it past
// segmentSizeLimit (a single larger batch still goes into one segment), so
// Compact can free disk in units of at most about that size. Segments are
// filled with zeros preallocChunk at a time ahead of the write position:
// overwriting allocated blocks lets fdatasync skip the file-size and extent
// updates a growing file would need. Tests lower both.
var (
	segmentSizeLimit int64 = 64 << 20
	preallocChunk    int64 = 4 << 20
)

// segment is one WAL file, <seq as 16 hex digits>.wal.
type segment struct {
	seq  uint64
	path string
	f    *os.File
	// maxIndex is the highest log index any record in the segment names;
	// once the log is compacted past it the segment holds nothing needed.
	maxIndex uint64
}

func segmentName(seq uint64) string { return fmt.Sprintf("%016x.wal", seq) }

// parseSegmentName returns the sequence number in a segment's file name.
func parseSegmentName(name string) (uint64, bool) {
	hex, ok := strings.CutSuffix(name, ".wal")
	if !ok || len(hex) != 16 {
		return 0, false
	}
	seq, err := strconv.ParseUint(hex, 16, 64)
	return seq, err == nil
}

// listSegments returns the sequence numbers of dir's segments in order,
// removing the temporary files an interrupted createSegment leaves. Any
// other file is ErrCorrupt: the directory belongs to this package alone.
func listSegments(dir string) ([]uint64, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, corruptf(dir, "WAL directory missing")
		}
		return nil, fmt.Errorf("raftlog: read %s: %w", dir, err)
	}
	var seqs []uint64
	for _, de := range des {
		name := de.Name()
		if strings.HasSuffix(name, ".wal.tmp") {
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				return nil, fmt.Errorf("raftlog: remove %s: %w", name, err)
			}
			continue
		}
		seq, ok := parseSegmentName(name)
		if !ok || !de.Type().IsRegular() {
			return nil, corruptf(filepath.Join(dir, name), "unexpected file in the WAL directory")
		}
		seqs = append(seqs, seq)
	}
	sort.Slice(seqs, func(i, j int) bool { return seqs[i] < seqs[j] })
	for i := 1; i < len(seqs); i++ {
		if seqs[i] != seqs[i-1]+1 {
			return nil, corruptf(filepath.Join(dir, segmentName(seqs[i-1]+1)), "WAL segment missing")
		}
	}
	return seqs, nil
}

// createSegment writes a new segment holding only first (its recBase
// record) followed by preallocChunk of zeros, under a temporary name that
// is renamed into place once fsynced: a segment file is never seen
// without its base record. It returns the open segment and the allocated
// (zero-filled) size.
func createSegment(dir string, seq uint64, first []byte) (*segment, int64, error) {
	path := filepath.Join(dir, segmentName(seq))
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, 0, fmt.Errorf("create WAL segment: %w", err)
	}
	size := max(preallocChunk, int64(len(first)))
	err = writeZeros(f, 0, size)
	if err == nil {
		_, err = f.WriteAt(first, 0)
	}
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil {
		err = fileutil.SyncDir(dir)
	}
	if err != nil {
		_ = f.Close()
		_ = os.Remove(tmp)
		return nil, 0, fmt.Errorf("create WAL segment %s: %w", path, err)
	}
	return &segment{seq: seq, path: path, f: f}, size, nil
}

var zeroBlock = make([]byte, 1<<20)

// writeZeros fills [from, to) of f with zeros.
func writeZeros(f *os.File, from, to int64) error {
	for off := from; off < to; {
		n := min(int64(len(zeroBlock)), to-off)
		if _, err := f.WriteAt(zeroBlock[:n], off); err != nil {
			return err
		}
		off += n
	}
	return nil
}
