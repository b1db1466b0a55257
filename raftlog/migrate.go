package raftlog

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/leased/leased/internal/fileutil"
)

// migrateV1 moves a format 1 file's entries and HardState into a fresh
// WAL and makes raft.db format 2. Each step is safe to crash after:
//
//  1. any wal/ directory is removed (only an interrupted migration of this
//     file can have left one, since raft.db still says format 1);
//  2. segment 1 is written complete, one batch holding a recReset at the
//     old offset carrying the HardState, then every entry, and fsynced under a
//     temporary name before it is renamed into place;
//  3. one bbolt transaction points walfrom at that recReset, drops the
//     entries bucket and the HardState and sets format 2.
//
// Until step 3 commits the file is format 1 and the next Open starts over.
func migrateV1(db *bolt.DB, path, walDir string) (walFrom, error) {
	var rec []byte
	var from walFrom
	err := guard(path, func() error {
		return db.View(func(tx *bolt.Tx) error {
			var err error
			rec, from, err = v1Records(tx)
			return err
		})
	})
	if err != nil {
		if errors.Is(err, ErrCorrupt) {
			return from, err
		}
		return from, corruptf(path, "%v", err)
	}
	if err := os.RemoveAll(walDir); err != nil {
		return from, fmt.Errorf("raftlog: migrate: %w", err)
	}
	if err := os.Mkdir(walDir, 0o700); err != nil {
		return from, fmt.Errorf("raftlog: migrate: %w", err)
	}
	if err := fileutil.SyncDir(filepath.Dir(walDir)); err != nil {
		return from, fmt.Errorf("raftlog: migrate: %w", err)
	}
	seg, _, err := createSegment(walDir, from.seq, rec)
	if err != nil {
		return from, fmt.Errorf("raftlog: migrate: %w", err)
	}
	if err := seg.f.Close(); err != nil {
		return from, fmt.Errorf("raftlog: migrate: %w", err)
	}
	err = guard(path, func() error {
		return db.Update(func(tx *bolt.Tx) error {
			meta := tx.Bucket(bucketMeta)
			if err := meta.Put(keyWALFrom, from.encode()); err != nil {
				return err
			}
			if err := meta.Delete(keyHardState); err != nil {
				return err
			}
			if err := tx.DeleteBucket(bucketEntries); err != nil {
				return err
			}
			return putFormat(meta, formatVersion)
		})
	})
	if err != nil {
		return from, fmt.Errorf("raftlog: migrate %s: %w", path, err)
	}
	return from, nil
}

// migrateBatchSize bounds the batches a migration writes, well below
// maxRecordSize.
const migrateBatchSize = 16 << 20

// v1Records reads a format 1 log (checking it as format 1 Open did) and
// returns the records of its WAL segment 1 and where its recReset lies.
func v1Records(tx *bolt.Tx) ([]byte, walFrom, error) {
	var from walFrom
	meta, ents := tx.Bucket(bucketMeta), tx.Bucket(bucketEntries)
	if ents == nil {
		return nil, from, errors.New("format 1 file without an entries bucket")
	}
	hs, err := readV1HardState(meta)
	if err != nil {
		return nil, from, err
	}
	c := ents.Cursor()
	k, v := c.First()
	if k == nil {
		return nil, from, errors.New("entries bucket is empty (no dummy entry)")
	}
	dummy, err := decodeEntry(k, v)
	if err != nil {
		return nil, from, err
	}
	at := point{dummy.GetIndex(), dummy.GetTerm()}
	rec, err := baseRecord(1, at, hs)
	if err != nil {
		return nil, from, err
	}
	from = walFrom{seq: 1, off: int64(len(rec)), at: at}
	batch, err := appendReset(newBatch(), at, hs)
	if err != nil {
		return nil, from, err
	}
	last := at.index
	for k, v = c.Next(); k != nil; k, v = c.Next() {
		e, err := decodeEntry(k, v)
		if err != nil {
			return nil, from, err
		}
		if e.GetIndex() != last+1 {
			return nil, from, fmt.Errorf("log gap: entry %d follows %d", e.GetIndex(), last)
		}
		last = e.GetIndex()
		if batch, err = appendProtoRecord(batch, recEntry, e); err != nil {
			return nil, from, err
		}
		if len(batch) > migrateBatchSize {
			sealBatch(batch)
			rec, batch = append(rec, batch...), newBatch()
		}
	}
	if len(batch) > batchHeaderSize {
		sealBatch(batch)
		rec = append(rec, batch...)
	}
	return rec, from, nil
}

func readV1HardState(meta *bolt.Bucket) (*raftpb.HardState, error) {
	if meta.Get(keyHardState) == nil {
		return nil, nil
	}
	hs := &raftpb.HardState{}
	if err := getProto(meta, keyHardState, hs); err != nil {
		return nil, err
	}
	return hs, nil
}

// decodeEntry decodes the format 1 entry stored under key k.
func decodeEntry(k, v []byte) (*raftpb.Entry, error) {
	i, ok := keyIndex(k)
	if !ok {
		return nil, fmt.Errorf("entry key %x is not an index", k)
	}
	if v == nil {
		return nil, fmt.Errorf("entry %d is a bucket", i)
	}
	body, err := unseal(v)
	if err != nil {
		return nil, fmt.Errorf("entry %d: %w", i, err)
	}
	e := &raftpb.Entry{}
	if err := proto.Unmarshal(body, e); err != nil {
		return nil, fmt.Errorf("entry %d: %w", i, err)
	}
	if e.GetIndex() != i {
		return nil, fmt.Errorf("entry under key %d has index %d", i, e.GetIndex())
	}
	return e, nil
}
