package raftlog

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/leased/leased/internal/fileutil"
)

// lockTimeout bounds how long Open waits for another holder of the file to
// let go. A restarting node's predecessor releases the lock when it exits,
// so a short wait suffices and a real conflict fails fast.
const lockTimeout = time.Second

// Open opens the raft log in dir, creating dir (mode 0700), a fresh
// raft.db recording id and an empty WAL if raft.db does not exist. An
// existing log is checked completely before Open returns: bbolt's page
// structure, this package's buckets and format version, and every WAL
// record. A log that fails any check is reported as ErrCorrupt and left
// untouched; Open never replaces it.
//
// A non-zero id must equal the identity the file records, else Open fails
// with ErrIdentityMismatch. A zero id accepts any recorded identity.
func Open(dir string, id Identity) (*Storage, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("raftlog: create data dir: %w", err)
	}
	path := filepath.Join(dir, fileName)
	if err := createIfMissing(dir, path, id); err != nil {
		return nil, err
	}
	db, err := openBolt(path, false)
	if err != nil {
		return nil, err
	}
	s, err := openLocked(dir, path, db, id)
	if err != nil {
		_ = closeBolt(db, path)
		return nil, err
	}
	return s, nil
}

// openLocked loads raft.db and replays the WAL once db holds the lock.
func openLocked(dir, path string, db *bolt.DB, id Identity) (*Storage, error) {
	ds, err := loadDB(db, path)
	if err != nil {
		return nil, err
	}
	if !id.IsZero() && id != ds.id {
		return nil, fmt.Errorf("raftlog: open %s: %w: file has %v, caller is %v", path, ErrIdentityMismatch, ds.id, id)
	}
	mark, markPath, ack := ds.mark, path, (*ackFile)(nil)
	if ds.format != formatLegacyMark {
		if ack, mark, err = openAckFile(dir); err != nil {
			return nil, err
		}
		markPath = ack.path
	}
	st, w, err := replayWAL(filepath.Join(dir, walDirName), ds.from, mark, markPath)
	if err != nil {
		if ack != nil {
			_ = ack.close()
		}
		return nil, err
	}
	if ack == nil {
		if ack, err = migrateMark(dir, db, path, &st); err != nil {
			_ = w.close()
			return nil, err
		}
	}
	st.snap = ds.snap
	return &Storage{path: path, db: db, st: st, wal: w, ack: ack}, nil
}

// migrateMark moves a format 2 directory, whose raft.db holds the acked
// mark, to the current format: the ack file is written first, holding the
// log as it was checked, then raft.db drops its mark and records the new
// format in one transaction. A crash between the two leaves a format 2
// file, migrated again at the next Open.
func migrateMark(dir string, db *bolt.DB, path string, st *state) (*ackFile, error) {
	ack, err := createAckFile(dir, markOf(st))
	if err != nil {
		return nil, fmt.Errorf("raftlog: upgrade %s: %w", path, err)
	}
	err = guard(path, func() error {
		return db.Update(func(tx *bolt.Tx) error {
			meta := tx.Bucket(bucketMeta)
			if err := meta.Delete(keyAcked); err != nil {
				return err
			}
			return putFormat(meta, formatVersion)
		})
	})
	if err != nil {
		_ = ack.close()
		return nil, fmt.Errorf("raftlog: upgrade %s: %w", path, err)
	}
	return ack, nil
}

// boltOptions are the bbolt settings for the raft log. The freelist is not
// persisted (bbolt rebuilds it on open, as etcd configures it), which keeps
// commits small and leaves one less on-disk structure to go wrong.
func boltOptions(readOnly bool, openFile func(string, int, os.FileMode) (*os.File, error)) *bolt.Options {
	return &bolt.Options{
		Timeout:        lockTimeout,
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
		ReadOnly:       readOnly,
		OpenFile:       openFile,
	}
}

// openBolt opens an existing data file with bbolt, but only after locking
// it and checking its page structure (see pagecheck.go), and with panics and
// memory faults inside bbolt turned into ErrCorrupt.
func openBolt(path string, readOnly bool) (*bolt.DB, error) {
	openFile := func(name string, flag int, mode os.FileMode) (*os.File, error) {
		return openChecked(name, flag&^os.O_CREATE, mode, !readOnly)
	}
	var db *bolt.DB
	err := guard(path, func() (err error) {
		db, err = bolt.Open(path, 0o600, boltOptions(readOnly, openFile))
		return err
	})
	switch {
	case err == nil:
		return db, nil
	case errors.Is(err, ErrCorrupt), errors.Is(err, ErrLocked):
		return nil, err
	case errors.Is(err, berrors.ErrTimeout):
		return nil, fmt.Errorf("raftlog: open %s: %w", path, ErrLocked)
	case errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrChecksum), errors.Is(err, berrors.ErrVersionMismatch):
		return nil, corruptf(path, "%v", err)
	}
	return nil, fmt.Errorf("raftlog: open %s: %w", path, err)
}

// openChecked is bbolt's OpenFile hook: it opens and locks the file, then
// checks its structure before bbolt reads a byte of it.
func openChecked(name string, flag int, mode os.FileMode, exclusive bool) (*os.File, error) {
	f, err := os.OpenFile(name, flag, mode)
	if err != nil {
		return nil, err
	}
	if err := checkOpenFile(f, name, exclusive); err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

func checkOpenFile(f *os.File, name string, exclusive bool) error {
	if err := lockFile(f, exclusive, lockTimeout); err != nil {
		return fmt.Errorf("raftlog: open %s: %w", name, err)
	}
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("raftlog: open %s: %w", name, err)
	}
	if fi.Size() == 0 {
		// Files are created complete (see createIfMissing), so an empty one
		// was truncated or made by someone else; bbolt would format it.
		return corruptf(name, "empty file")
	}
	if err := checkBoltFile(f, fi.Size()); err != nil {
		return corruptf(name, "%v", err)
	}
	return nil
}

// createIfMissing creates the data file with its buckets and identity under
// a temporary name and links it into place, so raft.db never exists half
// made: a crash leaves either no file or a complete one. The WAL it points
// at (segment 1, holding the empty log) is made first; a wal/ directory
// without raft.db is what an interrupted creation leaves, and is replaced.
func createIfMissing(dir, path string, id Identity) error {
	if _, err := os.Stat(path); err == nil || !errors.Is(err, fs.ErrNotExist) {
		if err != nil {
			return fmt.Errorf("raftlog: stat %s: %w", path, err)
		}
		return nil
	}
	from, err := createWAL(filepath.Join(dir, walDirName))
	if err != nil {
		return fmt.Errorf("raftlog: create WAL: %w", err)
	}
	ack, err := createAckFile(dir, ackMark{})
	if err != nil {
		return fmt.Errorf("raftlog: %w", err)
	}
	if err := ack.close(); err != nil {
		return fmt.Errorf("raftlog: create %s: %w", ack.path, err)
	}
	tmp, err := os.CreateTemp(dir, fileName+".init-*")
	if err != nil {
		return fmt.Errorf("raftlog: create data file: %w", err)
	}
	tmpName := tmp.Name()
	defer os.Remove(tmpName)
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("raftlog: create data file: %w", err)
	}
	if err := initFile(tmpName, id, from); err != nil {
		return fmt.Errorf("raftlog: create data file: %w", err)
	}
	// Link, unlike rename, fails if a concurrent Open created the file first.
	if err := os.Link(tmpName, path); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("raftlog: create data file: %w", err)
	}
	if err := fileutil.SyncDir(dir); err != nil {
		return fmt.Errorf("raftlog: create data file: %w", err)
	}
	return nil
}

// createWAL makes walDir afresh with segment 1 holding the empty log: a
// base record and a batch holding just the recReset walfrom points at.
func createWAL(walDir string) (walFrom, error) {
	zero := point{}
	base, err := baseRecord(1, zero, nil)
	if err != nil {
		return walFrom{}, err
	}
	batch, err := appendReset(newBatch(), zero, nil)
	if err != nil {
		return walFrom{}, err
	}
	sealBatch(batch)
	if err := os.RemoveAll(walDir); err != nil {
		return walFrom{}, err
	}
	if err := os.Mkdir(walDir, 0o700); err != nil {
		return walFrom{}, err
	}
	seg, _, err := createSegment(walDir, 1, append(base, batch...))
	if err != nil {
		return walFrom{}, err
	}
	if err := seg.f.Close(); err != nil {
		return walFrom{}, err
	}
	return walFrom{seq: 1, off: int64(len(base)), at: zero}, fileutil.SyncDir(filepath.Dir(walDir))
}

func initFile(name string, id Identity, from walFrom) error {
	db, err := bolt.Open(name, 0o600, boltOptions(false, nil))
	if err != nil {
		return err
	}
	err = db.Update(func(tx *bolt.Tx) error { return initLayout(tx, id, from) })
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	return err
}

// closeBolt closes db, converting a panic from a damaged file into an error.
func closeBolt(db *bolt.DB, path string) error {
	return guard(path, func() error {
		if err := db.Close(); err != nil {
			return fmt.Errorf("raftlog: close %s: %w", path, err)
		}
		return nil
	})
}

// guard runs f, turning a panic or a memory fault (bbolt reads its file
// through mmap) into ErrCorrupt. The page check should leave nothing for it
// to catch; it is the second line of defence.
func guard(path string, f func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = corruptf(path, "bbolt panicked: %v", r)
		}
	}()
	return f()
}

// corruptf builds an ErrCorrupt error naming the file.
func corruptf(path, format string, args ...any) error {
	return fmt.Errorf("raftlog: %s: %w: %s", path, ErrCorrupt, fmt.Sprintf(format, args...))
}
