// Package restore founds a new cluster from a backup, offline: it writes one data dir per new member
// (leasectl snapshot restore), from the same file and the same initial cluster. It does not start a node
// and links none of one, so leasectl carries it without the server.
package restore

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/internal/fileutil"
	"github.com/leased/leased/raftlog"
	"github.com/leased/leased/server/internal/errs"
	"github.com/leased/leased/server/internal/ids"
)

// The token floor (decision 12): the old cluster may have kept granting after the backup, and clusters
// restored earlier from this backup or another of the same lineage granted above their own floors, with
// tokens the backup cannot know. The restored cluster's raft log therefore starts after a floor above all
// of them: each data dir holds a raft snapshot at index floor (term 1, the new members as voters) and a
// HardState committing it, so the first entry of the new cluster has index floor+1 and every token it
// grants is above floor. Every node of the new cluster holds the same snapshot (the same floor: the
// cluster id derives from it, so members restored with different floors refuse each other), so raft
// starts from there (RestartNode, no bootstrap entries) and no node needs a snapshot sent.

// The default floor only goes up: it is read from the clock of the machine running the restore,
//
//	floor = Unix time in microseconds + DefaultTokenFloorBump,
//
// whatever the snapshot, so a second restore of the same backup, or of an older one, starts above the
// first. It rests on two assumptions:
//
//   - R: no cluster appends more than 1,000,000 entries a second on average since it was founded or
//     restored (tokens are log indexes; every grant, release, expiry and checkpoint is one entry);
//   - C: the clocks of the machines that run restores do not go backwards from one restore to the next
//     (a clock kept by NTP).
//
// Under them, every index any cluster of a lineage has reached at time t is at most t in microseconds +
// 2^40: a cluster founded by flags started at 0 and has appended at most one entry a microsecond since,
// and a restored one started at its restore time + 2^40 (or at a lower floor given) and has done the
// same. So a floor read later is above every token issued before it. For a cluster founded by flags,
// whose index stays below the clock's microseconds, the floor is also above its backup's index + 2^40
// with no rate assumed: room for 127 days at 100,000 entries a second after the backup. A backup's
// applied index above the default floor breaks the bound (this machine's clock is behind an earlier
// restore's, or an explicit --token-floor lifted the lineage above the clock): DataDir refuses it
// with ErrClockBehind, and the operator gives the floor. The floor is below 2^53 (exact in JSON and
// JavaScript numbers) until the year 2255: today's clock reads about 1.8 × 10^15 µs, 2^53 is 9 × 10^15.
// A floor taken as max(index + 2^40, clock) would not do: a backup of a restored cluster taken soon
// after its restore has index + 2^40 above the clock, and two restores of it would share the floor.
// See docs/operations.md, "Back up and restore".

// DefaultTokenFloorBump is what the default floor adds to the clock's microseconds.
const DefaultTokenFloorBump = 1 << 40

// DefaultTokenFloor is the floor a restore run at now takes when none is given.
func DefaultTokenFloor(now time.Time) uint64 {
	return uint64(max(now.UnixMicro(), 0)) + DefaultTokenFloorBump
}

// MaxTokenFloor is the largest floor a restore accepts: tokens must stay within int64, the range fence
// stores keep.
const MaxTokenFloor = math.MaxInt64 / 2

// restoredTerm is the raft term of the restored snapshot and HardState; the new cluster's first election
// moves past it.
const restoredTerm = 1

// Config describes one member's data dir of a cluster restored from a backup.
type Config struct {
	// Snapshot is the backup: the bytes the Snapshot RPC streamed (leasectl snapshot save's file).
	Snapshot []byte
	// Name is this member's name; it must be one of InitialCluster's.
	Name string
	// DataDir must not exist or be empty: a restore never writes over a data dir.
	DataDir string
	// InitialCluster is the new cluster's members, name -> peer address, as leased's --initial-cluster;
	// the same for every member, and the same the restored nodes are started with.
	InitialCluster map[string]string
	// TokenFloor is the index the restored log starts after; every token of the new cluster is above it.
	// 0 means DefaultTokenFloor(Now()). It may not be below the applied index. Every member of one new
	// cluster must be restored with the same floor: give the first member's to the others.
	TokenFloor uint64
	// Now reads the clock for the default floor; nil means time.Now.
	Now func() time.Time
}

// Info describes what DataDir wrote.
type Info struct {
	// AppliedIndex is the backup's; TokenFloor the floor used.
	AppliedIndex, TokenFloor uint64
	// HighestToken is the largest token in the backup; Leases the number of live leases it holds.
	HighestToken uint64
	Leases       int
	// ClusterID and NodeID are the identity recorded in the data dir; Generation is the new cluster's
	// (the backup's + 1).
	ClusterID, NodeID, Generation uint64
	// DefaultFloor says TokenFloor was read from the clock (no floor was given).
	DefaultFloor bool
}

// ErrInvalid: the config or the floor is not acceptable; it is package server's ErrInvalid.
var ErrInvalid = errs.ErrInvalid

// ErrDataDirNotEmpty: a restore was asked to write into a data dir that already holds something.
var ErrDataDirNotEmpty = errors.New("data dir is not empty")

// ErrClockBehind: no floor was given and the default floor, read from the clock, is below the backup's
// applied index, so it cannot be trusted to exceed the tokens of the backup's cluster (DefaultTokenFloor).
var ErrClockBehind = errors.New("the clock is behind the backup's tokens")

// DataDir writes a data dir for one member of a new cluster founded from a backup. Its raft log is
// built under a temporary name and renamed into place once complete and synced, so DataDir holds either
// no raft log or the whole restored one. leased then starts on it with the same
// --name and --initial-cluster as usual; a different --name is refused (the identity differs).
func DataDir(cfg Config) (Info, error) {
	if err := cfg.check(); err != nil {
		return Info{}, err
	}
	sm, err := fsm.Restore(cfg.Snapshot)
	if err != nil {
		return Info{}, err
	}
	info := Info{AppliedIndex: sm.AppliedIndex(), HighestToken: sm.HighestToken(), Leases: sm.Len(), TokenFloor: cfg.TokenFloor}
	if err := info.chooseFloor(cfg.Now); err != nil {
		return Info{}, err
	}
	info.ClusterID = restoredClusterID(cfg.InitialCluster, info.TokenFloor)
	info.NodeID = ids.Member(info.ClusterID, cfg.Name)
	voters := make([]uint64, 0, len(cfg.InitialCluster))
	members := make([]*leasepb.Member, 0, len(cfg.InitialCluster))
	for name, peer := range cfg.InitialCluster {
		id := ids.Member(info.ClusterID, name)
		voters = append(voters, id)
		members = append(members, &leasepb.Member{Id: id, Name: name, PeerAddr: peer})
	}
	slices.Sort(voters)
	if err := sm.Rebase(info.TokenFloor, members); err != nil {
		return Info{}, err
	}
	sm.SetClusterID(info.ClusterID)
	info.Generation = sm.Generation()
	data, err := sm.Snapshot()
	if err != nil {
		return Info{}, err
	}
	snap := &raftpb.Snapshot{
		Metadata: &raftpb.SnapshotMetadata{
			Index: new(info.TokenFloor), Term: new(uint64(restoredTerm)),
			ConfState: raftpb.EnsureConfState(&raftpb.ConfState{Voters: voters}),
		},
		Data: data,
	}
	hs := &raftpb.HardState{Term: new(uint64(restoredTerm)), Vote: new(uint64(0)), Commit: new(info.TokenFloor)}
	id := raftlog.Identity{ClusterID: info.ClusterID, NodeID: info.NodeID}
	if err := writeDataDir(cfg.DataDir, id, hs, snap); err != nil {
		return Info{}, err
	}
	return info, nil
}

// chooseFloor checks the given floor, or reads the default one from now (DefaultTokenFloor).
func (info *Info) chooseFloor(now func() time.Time) error {
	if info.TokenFloor == 0 {
		if now == nil {
			now = time.Now
		}
		info.TokenFloor, info.DefaultFloor = DefaultTokenFloor(now()), true
		if info.TokenFloor < info.AppliedIndex {
			return fmt.Errorf("%w: the default token floor %d (this machine's clock in microseconds + 2^40) is below the backup's "+
				"applied index %d: this clock is behind the one of an earlier restore, or an earlier restore was given a higher "+
				"--token-floor; check the clock, or give --token-floor above every token the backup's cluster may have issued",
				ErrClockBehind, info.TokenFloor, info.AppliedIndex)
		}
	}
	if info.TokenFloor < info.AppliedIndex || info.TokenFloor > MaxTokenFloor {
		return fmt.Errorf("%w: token floor %d must be between the backup's applied index %d and %d",
			ErrInvalid, info.TokenFloor, info.AppliedIndex, uint64(MaxTokenFloor))
	}
	return nil
}

// restoredClusterID is the id of a cluster founded from a backup: derived from its founding members, as
// for a cluster founded by flags, and from its floor, so that every restore makes a cluster of its own. A
// node left over from an earlier restore into the same --initial-cluster, or a member restored with
// another floor (whose log would disagree), is refused by its peers (they check the cluster id on every
// message) instead of joining.
func restoredClusterID(initial map[string]string, floor uint64) uint64 {
	return ids.Hash(fmt.Sprintf("restored:%016x:floor=%d", ids.Cluster(initial), floor))
}

func (cfg Config) check() error {
	switch {
	case cfg.Name == "":
		return fmt.Errorf("%w: a member name is required", ErrInvalid)
	case cfg.DataDir == "":
		return fmt.Errorf("%w: a data dir is required", ErrInvalid)
	case len(cfg.InitialCluster) == 0:
		return fmt.Errorf("%w: the initial cluster is required", ErrInvalid)
	}
	if _, ok := cfg.InitialCluster[cfg.Name]; !ok {
		return fmt.Errorf("%w: name %q is not in the initial cluster", ErrInvalid, cfg.Name)
	}
	return checkEmptyDir(cfg.DataDir)
}

// checkEmptyDir accepts a path that does not exist or is an empty directory.
func checkEmptyDir(dir string) error {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("data dir %s: %w", dir, err)
	case len(entries) > 0:
		return fmt.Errorf("%w: %s holds %s (a restore writes a new data dir; remove it or pick another)", ErrDataDirNotEmpty, dir, entries[0].Name())
	}
	return nil
}

// writeDataDir creates the raft log of a restored member in a temporary directory inside dir and moves
// the finished log into place: the WAL directory and the ack file first, raft.db last, so dir holds either no raft.db or a
// complete log (raftlog discards a WAL directory without raft.db beside it as an interrupted creation).
// Building it inside dir (not beside it) keeps the renames on one file system when dir is a mount point
// or a volume.
func writeDataDir(dir string, id raftlog.Identity, hs *raftpb.HardState, snap *raftpb.Snapshot) (err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	tmp, err := os.MkdirTemp(dir, ".restore-*")
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	defer func() {
		if rerr := os.RemoveAll(tmp); err == nil && rerr != nil {
			err = fmt.Errorf("restore: %w", rerr)
		}
	}()
	storage, err := raftlog.Open(tmp, id)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	err = storage.Save(hs, nil, snap)
	if cerr := storage.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("restore: write raft log: %w", err)
	}
	for _, name := range []string{raftlog.WALDirName, raftlog.AckFileName, raftlog.FileName} {
		if err := os.Rename(filepath.Join(tmp, name), filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("restore: move into place: %w", err)
		}
		if err := fileutil.SyncDir(dir); err != nil {
			return fmt.Errorf("restore: %w", err)
		}
	}
	if err := fileutil.SyncDir(filepath.Dir(filepath.Clean(dir))); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	return nil
}
