package raftlog

import (
	"encoding/binary"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	"go.etcd.io/raft/v3/raftpb"
)

// initLayout writes a fresh file's buckets, format version, identity, an
// empty snapshot and the dummy entry at index 0.
func initLayout(tx *bolt.Tx, id Identity) error {
	meta, err := tx.CreateBucket(bucketMeta)
	if err != nil {
		return err
	}
	for _, name := range [][]byte{bucketSnapshot, bucketEntries} {
		if _, err := tx.CreateBucket(name); err != nil {
			return err
		}
	}
	var ver [4]byte
	binary.BigEndian.PutUint32(ver[:], formatVersion)
	if err := meta.Put(keyFormat, ver[:]); err != nil {
		return err
	}
	if err := meta.Put(keyIdentity, id.encode()); err != nil {
		return err
	}
	w := &writer{tx: tx, st: &state{}}
	if err := w.putSnapshot(raftpb.EnsureSnapshotMetadata(nil), nil); err != nil {
		return err
	}
	return w.putEntry(&raftpb.Entry{Index: new(uint64), Term: new(uint64)})
}

// loadState reads and checks everything the file holds, walking the whole
// log, and returns the in-memory state and the recorded identity. Any
// inconsistency is ErrCorrupt naming path.
func loadState(db *bolt.DB, path string) (st state, id Identity, err error) {
	err = guard(path, func() error {
		return db.View(func(tx *bolt.Tx) error {
			var lerr error
			st, id, lerr = readAll(tx)
			return lerr
		})
	})
	if err != nil && !errors.Is(err, ErrCorrupt) {
		err = corruptf(path, "%v", err)
	}
	return st, id, err
}

func readAll(tx *bolt.Tx) (st state, id Identity, err error) {
	meta, snapB, ents := tx.Bucket(bucketMeta), tx.Bucket(bucketSnapshot), tx.Bucket(bucketEntries)
	if meta == nil || snapB == nil || ents == nil {
		return st, id, errors.New("missing raftlog buckets (not a raft log file?)")
	}
	if v := meta.Get(keyFormat); len(v) != 4 || binary.BigEndian.Uint32(v) != formatVersion {
		return st, id, fmt.Errorf("unknown format version %x, want %d", v, formatVersion)
	}
	if id, err = decodeIdentity(meta.Get(keyIdentity)); err != nil {
		return st, id, fmt.Errorf("identity: %w", err)
	}
	if st.hs, err = readHardState(meta); err != nil {
		return st, id, err
	}
	st.snap = &raftpb.SnapshotMetadata{}
	if err := getProto(meta, keySnapMeta, st.snap); err != nil {
		return st, id, err
	}
	if v := snapB.Get(keySnapData); v != nil {
		if _, err := unseal(v); err != nil {
			return st, id, fmt.Errorf("snapshot data: %w", err)
		}
	}
	err = readEntries(ents, &st)
	return st, id, err
}

func readHardState(meta *bolt.Bucket) (*raftpb.HardState, error) {
	if meta.Get(keyHardState) == nil {
		return nil, nil
	}
	hs := &raftpb.HardState{}
	if err := getProto(meta, keyHardState, hs); err != nil {
		return nil, err
	}
	return hs, nil
}

// readEntries walks the log: keys must be consecutive indexes, the first
// being the dummy entry, and every value must decode to its own index.
func readEntries(b *bolt.Bucket, st *state) error {
	c := b.Cursor()
	k, v := c.First()
	if k == nil {
		return errors.New("entries bucket is empty (no dummy entry)")
	}
	for ; k != nil; k, v = c.Next() {
		e, err := decodeEntry(k, v)
		if err != nil {
			return err
		}
		i := e.GetIndex()
		switch {
		case st.terms.runs == nil:
			st.terms.resetTo(i, e.GetTerm())
		case i != st.last+1:
			return fmt.Errorf("log gap: entry %d follows %d", i, st.last)
		default:
			st.terms.add(i, e.GetTerm())
		}
		st.last = i
	}
	return nil
}

// decodeEntry decodes the entry stored under key k.
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
