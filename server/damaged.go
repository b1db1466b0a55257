package server

import (
	"errors"
	"fmt"

	"github.com/leased/leased/raftlog"
)

// dataRunbook names the runbook for a data dir the node refuses: damaged
// files, or a log shorter than the node acknowledged.
const dataRunbook = `docs/operations.md, "A damaged or short data dir"`

// withDataRunbook adds the runbook to an error that refuses the data dir.
// Such a node must not start on it: it is replaced, never repaired by hand.
func withDataRunbook(err error) error {
	if !errors.Is(err, raftlog.ErrCorrupt) {
		return err
	}
	return fmt.Errorf("%w (this member cannot start on this data dir: replace it, see %s)", err, dataRunbook)
}
