package raftlog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	"go.etcd.io/raft/v3/raftpb"
)

// dbState is what raft.db holds: everything but the entries and the
// HardState (which live in the WAL from format 2 on).
type dbState struct {
	id     Identity
	format uint32
	snap   *raftpb.SnapshotMetadata
	from   walFrom
	mark   ackMark // format 2 only (later formats keep it in the ack file); zero if never written
}

// initLayout writes a fresh file's buckets, format version, identity, an
// empty snapshot and the WAL position replay starts from.
func initLayout(tx *bolt.Tx, id Identity, from walFrom) error {
	meta, err := tx.CreateBucket(bucketMeta)
	if err != nil {
		return err
	}
	if _, err := tx.CreateBucket(bucketSnapshot); err != nil {
		return err
	}
	if err := putFormat(meta, formatVersion); err != nil {
		return err
	}
	if err := meta.Put(keyIdentity, id.encode()); err != nil {
		return err
	}
	if err := meta.Put(keyWALFrom, from.encode()); err != nil {
		return err
	}
	return putSnapshot(tx, raftpb.EnsureSnapshotMetadata(nil), nil)
}

func putFormat(meta *bolt.Bucket, v uint32) error {
	var ver [4]byte
	binary.BigEndian.PutUint32(ver[:], v)
	return meta.Put(keyFormat, ver[:])
}

// putSnapshot stores snapshot metadata and data; nil data is stored as
// absent so Snapshot returns nil, as MemoryStorage would.
func putSnapshot(tx *bolt.Tx, md *raftpb.SnapshotMetadata, data []byte) error {
	v, err := sealProto(md)
	if err != nil {
		return err
	}
	if err := tx.Bucket(bucketMeta).Put(keySnapMeta, v); err != nil {
		return err
	}
	sb := tx.Bucket(bucketSnapshot)
	if data == nil {
		return sb.Delete(keySnapData)
	}
	return sb.Put(keySnapData, seal(data))
}

// loadDB reads and checks everything raft.db holds. Any inconsistency is
// ErrCorrupt naming path.
func loadDB(db *bolt.DB, path string) (ds dbState, err error) {
	err = guard(path, func() error {
		return db.View(func(tx *bolt.Tx) error {
			var lerr error
			ds, lerr = readDB(tx)
			return lerr
		})
	})
	if err != nil && !errors.Is(err, ErrCorrupt) {
		err = corruptf(path, "%v", err)
	}
	return ds, err
}

func readDB(tx *bolt.Tx) (ds dbState, err error) {
	meta, snapB := tx.Bucket(bucketMeta), tx.Bucket(bucketSnapshot)
	if meta == nil || snapB == nil {
		return ds, errors.New("missing raftlog buckets (not a raft log file?)")
	}
	v := meta.Get(keyFormat)
	if len(v) != 4 {
		return ds, fmt.Errorf("unknown format version %x", v)
	}
	switch ds.format = binary.BigEndian.Uint32(v); {
	case ds.format > formatVersion:
		return ds, fmt.Errorf("format version %d is newer than this build knows (%d): use a newer leased", ds.format, formatVersion)
	case ds.format != formatVersion && ds.format != formatLegacyMark:
		return ds, fmt.Errorf("unknown format version %d, want %d", ds.format, formatVersion)
	}
	if ds.id, err = decodeIdentity(meta.Get(keyIdentity)); err != nil {
		return ds, fmt.Errorf("identity: %w", err)
	}
	ds.snap = &raftpb.SnapshotMetadata{}
	if err := getProto(meta, keySnapMeta, ds.snap); err != nil {
		return ds, err
	}
	if v := snapB.Get(keySnapData); v != nil {
		if _, err := unseal(v); err != nil {
			return ds, fmt.Errorf("snapshot data: %w", err)
		}
	}
	known := [][]byte{keyFormat, keyIdentity, keySnapMeta, keyWALFrom}
	if ds.format == formatLegacyMark {
		known = append(known, keyAcked)
	}
	if err := onlyKnownKeys(meta, known...); err != nil {
		return ds, err
	}
	if err := onlyKnownKeys(snapB, keySnapData); err != nil {
		return ds, err
	}
	if ds.mark, err = decodeLegacyAckMark(meta.Get(keyAcked)); err != nil {
		return ds, err
	}
	ds.from, err = decodeWALFrom(meta.Get(keyWALFrom))
	return ds, err
}

// onlyKnownKeys fails on any key of b not in known. A damaged key would
// otherwise read as a missing one, and a format 2 file's acked mark may be
// missing legitimately: damage must not switch the amnesia guard off.
func onlyKnownKeys(b *bolt.Bucket, known ...[]byte) error {
	return b.ForEach(func(k, _ []byte) error {
		for _, want := range known {
			if bytes.Equal(k, want) {
				return nil
			}
		}
		return fmt.Errorf("unknown key %q", k)
	})
}

// getProto reads a sealed message stored under key.
func getProto(b *bolt.Bucket, key []byte, m proto.Message) error {
	v := b.Get(key)
	if v == nil {
		return fmt.Errorf("missing %s record", key)
	}
	body, err := unseal(v)
	if err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	if err := proto.Unmarshal(body, m); err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	return nil
}
