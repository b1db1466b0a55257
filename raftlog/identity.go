package raftlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Identity names the cluster and node a data directory belongs to. It is
// written when the file is created and checked on every Open, so a directory
// copied to the wrong machine or left over from another cluster is refused
// instead of joining with someone else's votes and log.
type Identity struct {
	ClusterID uint64
	NodeID    uint64
}

// IsZero reports whether id is the zero Identity, which Open treats as
// "unknown": it accepts whatever identity an existing file records.
func (id Identity) IsZero() bool { return id == Identity{} }

// String formats id as cluster/node in 16-digit hex, the way leased prints ids everywhere.
func (id Identity) String() string {
	return fmt.Sprintf("cluster %016x node %016x", id.ClusterID, id.NodeID)
}

func (id Identity) encode() []byte {
	var b [16]byte
	binary.BigEndian.PutUint64(b[0:], id.ClusterID)
	binary.BigEndian.PutUint64(b[8:], id.NodeID)
	return seal(b[:])
}

func decodeIdentity(v []byte) (Identity, error) {
	b, err := unseal(v)
	if err != nil {
		return Identity{}, err
	}
	if len(b) != 16 {
		return Identity{}, fmt.Errorf("identity of %d bytes, want 16", len(b))
	}
	return Identity{binary.BigEndian.Uint64(b[0:]), binary.BigEndian.Uint64(b[8:])}, nil
}

// ReadIdentity returns the identity recorded in dir's data file, so a server
// can learn who it is before calling Open. ok is false, with a nil error, when
// dir holds no data file. raft.db is opened read-only and fully checked, so
// a damaged file yields ErrCorrupt here too (the WAL is checked by Open); a
// file held open by a running Storage yields ErrLocked.
func ReadIdentity(dir string) (id Identity, ok bool, err error) {
	path := filepath.Join(dir, fileName)
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return Identity{}, false, nil
	} else if err != nil {
		return Identity{}, false, fmt.Errorf("raftlog: read identity: %w", err)
	}
	db, err := openBolt(path, true)
	if err != nil {
		return Identity{}, false, err
	}
	var ds dbState
	ds, err = loadDB(db, path)
	id = ds.id
	if cerr := closeBolt(db, path); err == nil {
		err = cerr
	}
	if err != nil {
		return Identity{}, false, err
	}
	return id, true, nil
}
