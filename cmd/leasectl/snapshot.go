package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/client"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/internal/fileutil"
	"github.com/leased/leased/server/restore"
)

// The snapshot commands: save streams a backup from the cluster (client.Snapshot); status and restore
// work offline on the file, with the state machine's decoder (fsm.Restore) and the offline restore
// (restore.DataDir), so what they accept is exactly what a node would.

func (a *app) snapshotCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "snapshot",
		Short: "Back up the lease state, inspect a backup, restore it into a new cluster",
		Example: `  leasectl snapshot save /backup/leased-$(date +%F).snap
  leasectl snapshot status /backup/leased.snap
  leasectl snapshot restore /backup/leased.snap --name n1 --data-dir /var/lib/leased \
    --initial-cluster n1=10.0.1.1:7201,n2=10.0.1.2:7201,n3=10.0.1.3:7201`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef(cmd, "unknown snapshot command %q (want save, status or restore)", args[0])
			}
			return usagef(cmd, "missing snapshot command (save, status or restore)")
		},
		RunE: func(*cobra.Command, []string) error { return nil },
	}
	cmd.AddCommand(a.snapshotSaveCommand(), a.snapshotStatusCommand(), a.snapshotRestoreCommand())
	return cmd
}

func fileArg(cmd *cobra.Command, args []string) error {
	if len(args) != 1 || args[0] == "" {
		return usagef(cmd, "expected one FILE")
	}
	return nil
}

func (a *app) snapshotSaveCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "save FILE",
		Short: "Stream a consistent snapshot of the lease state machine into FILE",
		Long: `save streams a consistent snapshot of the lease state machine from the cluster (taken after a
linearizable read: it holds every write acknowledged before save started) into a temporary file next to
FILE, checks the sha256 sent with the last chunk and decodes it, syncs it, and only then renames it into
place: FILE is never left half-written. It prints the snapshot's applied index, lease count and size.
The stream has no deadline once data flows; interrupt with SIGINT.`,
		Example: `  leasectl snapshot save /backup/leased.snap`,
		Args:    fileArg,
		RunE: a.body(func(cmd *cobra.Command, args []string) error {
			ctx, interrupted, stop := a.interruptible(cmd.Context())
			defer stop()
			sum, err := a.saveSnapshot(ctx, args[0])
			if err != nil {
				if interrupted() {
					return fmt.Errorf("snapshot save: %w", errInterrupted)
				}
				return err
			}
			return a.printSnapshot(sum)
		}),
	}
}

func (a *app) snapshotStatusCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "status FILE",
		Short: "Check a snapshot file and print its cluster, generation, applied index, lease count and size (offline)",
		Long: `status reads FILE without contacting the cluster, checks it completely (envelope, CRC-32C, every
record, as a node restoring it would) and prints what save printed: the id of the cluster it came from
and its generation (the number of restores behind that cluster), its applied index, leases, highest
token, size and sha256. A damaged or foreign file exits 1 with the reason.`,
		Example: `  leasectl snapshot status /backup/leased.snap -o json`,
		Args:    fileArg,
		RunE: a.body(func(_ *cobra.Command, args []string) error {
			data, err := os.ReadFile(args[0])
			if err != nil {
				return fmt.Errorf("snapshot status: %w", err)
			}
			sum, err := summarize(args[0], data)
			if err != nil {
				return fmt.Errorf("snapshot status: %w", err)
			}
			return a.printSnapshot(sum)
		}),
	}
}

// snapshotJSON is the shape of save's and status's JSON output.
type snapshotJSON struct {
	File string `json:"file"`
	// ClusterID is empty for a snapshot of an earlier version, which records none.
	ClusterID    string `json:"cluster_id"`
	Generation   uint64 `json:"generation"`
	AppliedIndex uint64 `json:"applied_index"`
	Leases       int    `json:"leases"`
	HighestToken uint64 `json:"highest_token"`
	SizeBytes    int64  `json:"size_bytes"`
	SHA256       string `json:"sha256"`
}

// summarize decodes a snapshot completely; an error names the file and says why it is not a snapshot.
func summarize(path string, data []byte) (snapshotJSON, error) {
	sm, err := fsm.Restore(data)
	if err != nil {
		return snapshotJSON{}, fmt.Errorf("%s is not a valid leased snapshot: %w", path, err)
	}
	sum := sha256.Sum256(data)
	out := snapshotJSON{File: path, Generation: sm.Generation(), AppliedIndex: sm.AppliedIndex(), Leases: sm.Len(),
		HighestToken: sm.HighestToken(), SizeBytes: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}
	if id := sm.ClusterID(); id != 0 {
		out.ClusterID = leasepb.FormatID(id)
	}
	return out, nil
}

func (a *app) printSnapshot(s snapshotJSON) error {
	if a.jsonOut() {
		return a.emitJSON(s)
	}
	cluster := s.ClusterID
	if cluster == "" {
		cluster = "-"
	}
	t := a.newTable("FILE", "CLUSTER", "GENERATION", "APPLIED INDEX", "LEASES", "HIGHEST TOKEN", "SIZE", "SHA256")
	t.row(s.File, cluster, strconv.FormatUint(s.Generation, 10), strconv.FormatUint(s.AppliedIndex, 10), strconv.Itoa(s.Leases),
		strconv.FormatUint(s.HighestToken, 10), bytesHuman(s.SizeBytes), s.SHA256)
	return t.flush()
}

// saveSnapshot writes the snapshot stream to a temporary file next to path, verifies it (the stream's
// sha256, then a full decode), syncs it and renames it into place, then syncs the directory.
func (a *app) saveSnapshot(ctx context.Context, path string) (sum snapshotJSON, err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".part-*")
	if err != nil {
		return sum, fmt.Errorf("snapshot save: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	err = a.withClient("", func(c *client.Client) error {
		_, err := c.Snapshot(ctx, tmp)
		return err
	})
	if err != nil {
		return sum, fmt.Errorf("snapshot save: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		return sum, fmt.Errorf("snapshot save: %w", err)
	}
	data, err := os.ReadFile(tmp.Name())
	if err != nil {
		return sum, fmt.Errorf("snapshot save: %w", err)
	}
	if sum, err = summarize(path, data); err != nil {
		return sum, fmt.Errorf("snapshot save: the cluster sent %w", err)
	}
	if err := tmp.Close(); err != nil {
		return sum, fmt.Errorf("snapshot save: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return sum, fmt.Errorf("snapshot save: %w", err)
	}
	if err := fileutil.SyncDir(dir); err != nil {
		return sum, fmt.Errorf("snapshot save: %w", err)
	}
	return sum, nil
}

func (a *app) snapshotRestoreCommand() *cobra.Command {
	var (
		name, dataDir, initial string
		floor                  uint64
	)
	cmd := &cobra.Command{
		Use:   "restore FILE --name NAME --data-dir DIR --initial-cluster NAME=HOST:PORT,... [--token-floor N]",
		Short: "Write a data dir for one member of a new cluster founded from a snapshot (offline)",
		Long: `restore writes DIR, the data dir of member NAME of a new cluster whose members are --initial-cluster
(name=peer-host:port, as leased takes it). Run it once per new member, with the same FILE, the same
--initial-cluster and the same floor (the first run prints it; pass it to the others with --token-floor),
then start each member with leased as usual (same --name, --data-dir and --initial-cluster). DIR must not exist or be empty; it is written under a temporary name and renamed
into place. It does not contact any cluster.

Every lease in the snapshot comes back with its holder, value, token and request id, and a full TTL
counted from the new cluster's first leader (its holder may be alive and renewing against the new
cluster; one whose holder is gone expires one TTL later).

Tokens never go backwards: the old cluster, and any cluster restored earlier from this or another of
its snapshots, may have granted tokens the snapshot does not know, so the new cluster's log starts after
--token-floor and every token it grants is larger. The default is read from this machine's clock: the
Unix time in microseconds + 2^40. It only goes up, so it is above every token issued before, assuming no
cluster appends more than 1,000,000 entries a second and the clocks of the machines that run restores do
not go backwards. restore prints the floor: give it with --token-floor to every other member of the same
new cluster (members restored with different floors belong to different clusters and never form one).
A snapshot whose applied index is above the default floor is refused (exit 1): give the floor. See
docs/operations.md.`,
		Example: `  leasectl snapshot restore leased.snap --name n1 --data-dir /var/lib/leased \
    --initial-cluster n1=10.0.1.1:7201,n2=10.0.1.2:7201,n3=10.0.1.3:7201
  # on n2 and n3, with the floor n1's restore printed:
  leasectl snapshot restore leased.snap --name n2 --data-dir /var/lib/leased \
    --initial-cluster n1=10.0.1.1:7201,n2=10.0.1.2:7201,n3=10.0.1.3:7201 --token-floor 1797220553745072`,
		Args: fileArg,
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := requireFlags(cmd, "name", "data-dir", "initial-cluster"); err != nil {
				return err
			}
			members, err := parseInitialCluster(initial)
			if err != nil {
				return usagef(cmd, "--initial-cluster: %v", err)
			}
			if _, ok := members[name]; !ok {
				return usagef(cmd, "--name %q is not one of --initial-cluster's members", name)
			}
			if cmd.Flags().Changed("token-floor") && floor == 0 {
				return usagef(cmd, "--token-floor must be positive (leave it out for the default)")
			}
			return nil
		},
		RunE: a.body(func(cmd *cobra.Command, args []string) error {
			data, err := os.ReadFile(args[0])
			if err != nil {
				return fmt.Errorf("snapshot restore: %w", err)
			}
			members, _ := parseInitialCluster(initial)
			info, err := restore.DataDir(restore.Config{
				Snapshot: data, Name: name, DataDir: dataDir, InitialCluster: members, TokenFloor: floor,
			})
			if err != nil {
				switch {
				case errors.Is(err, fsm.ErrBadSnapshot):
					err = fmt.Errorf("%s is not a valid leased snapshot: %w", args[0], err)
				case errors.Is(err, restore.ErrInvalid): // a --token-floor the snapshot rules out
					return usagef(cmd, "snapshot restore: %v", err)
				}
				return fmt.Errorf("snapshot restore: %w", err)
			}
			if info.DefaultFloor && len(members) > 1 {
				a.warnf("token floor %d read from this machine's clock: restore the other members with --token-floor %d",
					info.TokenFloor, info.TokenFloor)
			}
			return a.printRestore(name, dataDir, info)
		}),
	}
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "the member this data dir is for; one of --initial-cluster's names (required)")
	f.StringVar(&dataDir, "data-dir", "", "the data dir to write; must not exist or be empty (required)")
	f.StringVar(&initial, "initial-cluster", "", "the new cluster's members as name=peer-host:port,...; the same for every member (required)")
	f.Uint64Var(&floor, "token-floor", 0, "every token of the new cluster is above this; the same for every member (default: the Unix time in microseconds + 2^40)")
	return cmd
}

// parseInitialCluster reads name=host:port,... as leased's --initial-cluster does: names and addresses
// unique, every address host:port.
func parseInitialCluster(s string) (map[string]string, error) {
	members := map[string]string{}
	seen := map[string]bool{}
	for _, item := range strings.Split(s, ",") {
		name, addr, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok || name == "" || addr == "" {
			return nil, fmt.Errorf("member %q is not name=host:port", item)
		}
		if _, err := parseEndpoints(addr); err != nil {
			return nil, fmt.Errorf("member %s: %v", name, err)
		}
		if _, dup := members[name]; dup || seen[addr] {
			return nil, fmt.Errorf("member %s or its address %s appears twice", name, addr)
		}
		members[name], seen[addr] = addr, true
	}
	return members, nil
}

// restoreJSON is the shape of restore's JSON output.
type restoreJSON struct {
	Name         string `json:"name"`
	DataDir      string `json:"data_dir"`
	ClusterID    string `json:"cluster_id"`
	MemberID     string `json:"member_id"`
	Generation   uint64 `json:"generation"`
	AppliedIndex uint64 `json:"applied_index"`
	TokenFloor   uint64 `json:"token_floor"`
	Leases       int    `json:"leases"`
}

func (a *app) printRestore(name, dir string, info restore.Info) error {
	out := restoreJSON{Name: name, DataDir: dir, ClusterID: leasepb.FormatID(info.ClusterID), MemberID: leasepb.FormatID(info.NodeID),
		Generation: info.Generation, AppliedIndex: info.AppliedIndex, TokenFloor: info.TokenFloor, Leases: info.Leases}
	if a.jsonOut() {
		return a.emitJSON(out)
	}
	t := a.newTable("NAME", "DATA DIR", "CLUSTER", "MEMBER", "GENERATION", "APPLIED INDEX", "TOKEN FLOOR", "LEASES")
	t.row(out.Name, out.DataDir, out.ClusterID, out.MemberID, strconv.FormatUint(out.Generation, 10),
		strconv.FormatUint(out.AppliedIndex, 10), strconv.FormatUint(out.TokenFloor, 10), strconv.Itoa(out.Leases))
	return t.flush()
}
