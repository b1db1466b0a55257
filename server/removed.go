package server

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/leased/leased/internal/fileutil"
)

// removedMarker is the file a node writes into its data dir when it learns that it was removed from the
// cluster. Its presence makes New refuse the data dir: a removed node's log and votes must never count
// again (its raft id is not reused either; its name may be added again, under a new raft id).
const removedMarker = "REMOVED"

// writeRemovedMarker records the removal durably (file and directory synced).
func writeRemovedMarker(dir, why string) error {
	path := filepath.Join(dir, removedMarker)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("write removal marker: %w", err)
	}
	_, werr := f.WriteString(why + "\n")
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		return fmt.Errorf("write removal marker: %w", err)
	}
	if err := fileutil.SyncDir(dir); err != nil {
		return fmt.Errorf("write removal marker: %w", err)
	}
	return nil
}

// checkNotRemoved refuses a data dir whose node was removed from its cluster.
func checkNotRemoved(dir, name string) error {
	b, err := os.ReadFile(filepath.Join(dir, removedMarker))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("read removal marker: %w", err)
	}
	return removedDirErr(dir, name, strings.TrimSpace(string(b)))
}

func removedDirErr(dir, name, why string) error {
	return fmt.Errorf("%w (%s): member %q was removed from the cluster, and data dir %s must not serve again; "+
		"to bring this machine back, add it again (leasectl member add, under this name or another) and start it "+
		"on an empty data dir with --initial-cluster-state existing", ErrRemoved, why, name, dir)
}
