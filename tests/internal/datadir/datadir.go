// Package datadir reads and copies a stopped node's data dir for the multi-process tests that damage one
// (tests/e2e, tests/chaos): what its raft log holds, opened the way the node opens it, and whether a
// damaged copy holds all of it.
package datadir

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/raftlog"
)

// Log is what a data dir's raft log holds.
type Log struct {
	First, Last uint64
	Entries     []*raftpb.Entry
	HardState   *raftpb.HardState
	Snapshot    *raftpb.Snapshot
}

// Read opens the raft log in dir with raftlog.Open, as the node would, and reads all of it. Open may
// write to the files (it truncates a torn tail, records the acked mark): pass a copy.
func Read(dir string) (Log, error) {
	s, err := raftlog.Open(dir, raftlog.Identity{})
	if err != nil {
		return Log{}, err
	}
	defer s.Close()
	var l Log
	l.First, _ = s.FirstIndex()
	l.Last, _ = s.LastIndex()
	if l.Last >= l.First {
		if l.Entries, err = s.Entries(l.First, l.Last+1, 1<<40); err != nil {
			return Log{}, err
		}
	}
	if l.HardState, _, err = s.InitialState(); err != nil {
		return Log{}, err
	}
	if l.Snapshot, err = s.Snapshot(); err != nil {
		return Log{}, err
	}
	return l, nil
}

// Lacks says how got falls short of want: "" if it holds every entry, the hard state and the snapshot.
func (got Log) Lacks(want Log) string {
	switch {
	case got.First != want.First || got.Last != want.Last:
		return fmt.Sprintf("log [%d, %d], want [%d, %d]", got.First, got.Last, want.First, want.Last)
	case !proto.Equal(got.HardState, want.HardState):
		return fmt.Sprintf("hard state %v, want %v", got.HardState, want.HardState)
	case !proto.Equal(got.Snapshot, want.Snapshot):
		return "another snapshot"
	}
	for i := range want.Entries {
		if !proto.Equal(got.Entries[i], want.Entries[i]) {
			return fmt.Sprintf("entry %d differs", want.Entries[i].GetIndex())
		}
	}
	return ""
}

// Copy copies the regular files under src into dst (created).
func Copy(src, dst string) error {
	return filepath.WalkDir(src, func(path string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if de.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o700)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o600)
	})
}
