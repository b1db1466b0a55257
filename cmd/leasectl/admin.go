package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
)

// The member and snapshot commands call the Cluster service directly: the SDK has no methods for them
// (membership and snapshots are operator actions, not something programs embed). Each call goes to the
// endpoints in turn, following a leader hint, until one answers with something other than Unavailable.

// clusterCall runs rpc against the endpoints until one answers.
func clusterCall[T any](ctx context.Context, a *app, op string, rpc func(context.Context, leasepb.ClusterClient) (T, error)) (T, error) {
	var zero T
	creds := insecure.NewCredentials()
	if a.tlsConfig != nil {
		creds = credentials.NewTLS(a.tlsConfig)
	}
	queue := append([]string(nil), a.endpoints...)
	tried := map[string]bool{}
	var lastErr error
	for len(queue) > 0 && len(tried) < 2*len(a.endpoints)+1 {
		ep := queue[0]
		queue = queue[1:]
		if tried[ep] {
			continue
		}
		tried[ep] = true
		conn, err := grpc.NewClient(ep, grpc.WithTransportCredentials(creds))
		if err != nil {
			lastErr = err
			continue
		}
		out, err := rpc(ctx, leasepb.NewClusterClient(conn))
		_ = conn.Close()
		if err == nil {
			return out, nil
		}
		lastErr = err
		if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			break
		}
		if hint := leaderHintOf(err); hint != "" && !tried[hint] {
			queue = append([]string{hint}, queue...)
		}
	}
	return zero, grpcError(op, lastErr)
}

func leaderHintOf(err error) string {
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if h, ok := d.(*leasepb.LeaderHint); ok {
			return h.GetLeaderAddr()
		}
	}
	return ""
}

func (a *app) memberCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "member",
		Short: "List and change the cluster's Raft members",
		Long: `member lists the Raft configuration and changes it: new nodes join as learners (add) and become voters
once caught up (promote); remove takes a node out. These are explicit operator actions; gossip never changes
who votes. (The server answers these once membership changes are implemented; until then they exit 1 with
the server's answer.)`,
		Example: `  leasectl member list
  leasectl member add n4 --peer-addr 10.0.0.4:7201 --client-addr 10.0.0.4:7101
  leasectl member promote 4
  leasectl member remove 4`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef(cmd, "unknown member command %q (want list, add, promote or remove)", args[0])
			}
			return usagef(cmd, "missing member command (list, add, promote or remove)")
		},
		RunE: func(*cobra.Command, []string) error { return nil },
	}

	list := &cobra.Command{
		Use:     "list",
		Short:   "List the members of the Raft configuration",
		Example: `  leasectl member list -o json`,
		Args:    noArgs,
		RunE: a.body(func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := a.requestContext(cmd.Context())
			defer cancel()
			resp, err := clusterCall(ctx, a, "member list", func(ctx context.Context, cc leasepb.ClusterClient) (*leasepb.MemberListResponse, error) {
				return cc.MemberList(ctx, &leasepb.MemberListRequest{})
			})
			if err != nil {
				return err
			}
			return a.printMembers(resp.GetMembers())
		}),
	}

	var peerAddr, clientAddr string
	add := &cobra.Command{
		Use:     "add NAME --peer-addr HOST:PORT [--client-addr HOST:PORT]",
		Short:   "Add a node as a non-voting learner",
		Example: `  leasectl member add n4 --peer-addr 10.0.0.4:7201 --client-addr 10.0.0.4:7101`,
		Args:    nameArg,
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := requireFlags(cmd, "peer-addr"); err != nil {
				return err
			}
			if _, err := parseEndpoints(peerAddr); err != nil || peerAddr == "" {
				return usagef(cmd, "--peer-addr must be host:port")
			}
			if clientAddr != "" {
				if _, err := parseEndpoints(clientAddr); err != nil {
					return usagef(cmd, "--client-addr must be host:port")
				}
			}
			return nil
		},
		RunE: a.body(func(cmd *cobra.Command, args []string) error {
			ctx, cancel := a.requestContext(cmd.Context())
			defer cancel()
			resp, err := clusterCall(ctx, a, "member add", func(ctx context.Context, cc leasepb.ClusterClient) (*leasepb.MemberAddResponse, error) {
				return cc.MemberAdd(ctx, &leasepb.MemberAddRequest{Name: args[0], PeerAddr: peerAddr, ClientAddr: clientAddr})
			})
			if err != nil {
				return err
			}
			return a.printMembers(resp.GetMembers())
		}),
	}
	add.Flags().StringVar(&peerAddr, "peer-addr", "", "address the new node receives raft traffic on (required)")
	add.Flags().StringVar(&clientAddr, "client-addr", "", "address the new node serves clients on")
	_ = add.MarkFlagRequired("peer-addr")

	idCommand := func(use, short, example string, rpc func(context.Context, leasepb.ClusterClient, uint64) ([]*leasepb.Member, error)) *cobra.Command {
		return &cobra.Command{
			Use: use + " ID", Short: short, Example: example,
			Args: func(cmd *cobra.Command, args []string) error {
				if len(args) != 1 {
					return usagef(cmd, "expected one member ID")
				}
				if id, err := strconv.ParseUint(args[0], 10, 64); err != nil || id == 0 {
					return usagef(cmd, "member ID must be a positive number, got %q", args[0])
				}
				return nil
			},
			RunE: a.body(func(cmd *cobra.Command, args []string) error {
				id, _ := strconv.ParseUint(args[0], 10, 64)
				ctx, cancel := a.requestContext(cmd.Context())
				defer cancel()
				members, err := clusterCall(ctx, a, "member "+use, func(ctx context.Context, cc leasepb.ClusterClient) ([]*leasepb.Member, error) {
					return rpc(ctx, cc, id)
				})
				if err != nil {
					return err
				}
				return a.printMembers(members)
			}),
		}
	}
	promote := idCommand("promote", "Make a caught-up learner a voter", `  leasectl member promote 4`,
		func(ctx context.Context, cc leasepb.ClusterClient, id uint64) ([]*leasepb.Member, error) {
			resp, err := cc.MemberPromote(ctx, &leasepb.MemberPromoteRequest{Id: id})
			return resp.GetMembers(), err
		})
	remove := idCommand("remove", "Remove a member from the Raft configuration", `  leasectl member remove 4`,
		func(ctx context.Context, cc leasepb.ClusterClient, id uint64) ([]*leasepb.Member, error) {
			resp, err := cc.MemberRemove(ctx, &leasepb.MemberRemoveRequest{Id: id})
			return resp.GetMembers(), err
		})
	cmd.AddCommand(list, add, promote, remove)
	return cmd
}

func nameArg(cmd *cobra.Command, args []string) error {
	if len(args) != 1 || args[0] == "" {
		return usagef(cmd, "expected one NAME")
	}
	return nil
}

// memberJSON is the shape of the member commands' JSON output, one line per member.
type memberJSON struct {
	ID         uint64 `json:"id"`
	Name       string `json:"name"`
	PeerAddr   string `json:"peer_addr"`
	ClientAddr string `json:"client_addr"`
	IsLearner  bool   `json:"is_learner"`
}

func (a *app) printMembers(ms []*leasepb.Member) error {
	if a.jsonOut() {
		for _, m := range ms {
			if err := a.emitJSON(memberJSON{ID: m.GetId(), Name: m.GetName(), PeerAddr: m.GetPeerAddr(),
				ClientAddr: m.GetClientAddr(), IsLearner: m.GetIsLearner()}); err != nil {
				return err
			}
		}
		return nil
	}
	t := a.newTable("ID", "NAME", "PEER ADDRESS", "CLIENT ADDRESS", "LEARNER")
	for _, m := range ms {
		t.row(strconv.FormatUint(m.GetId(), 10), m.GetName(), m.GetPeerAddr(), orDash(m.GetClientAddr()), strconv.FormatBool(m.GetIsLearner()))
	}
	return t.flush()
}

func (a *app) snapshotCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "snapshot",
		Short:   "Save a snapshot of the lease state",
		Example: `  leasectl snapshot save /backup/leased-$(date +%F).snap`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef(cmd, "unknown snapshot command %q (want save)", args[0])
			}
			return usagef(cmd, "missing snapshot command (save)")
		},
		RunE: func(*cobra.Command, []string) error { return nil },
	}
	save := &cobra.Command{
		Use:   "save FILE",
		Short: "Stream a consistent snapshot of the lease state machine into FILE",
		Long: `save streams a consistent snapshot of the lease state machine from the cluster into FILE, checks its
sha256, and only then moves it into place (FILE is never left half-written). The snapshot has no deadline
beyond the cluster's; interrupt with SIGINT. (The server answers this once snapshots are implemented; until
then it exits 1 with the server's answer.)`,
		Example: `  leasectl snapshot save /backup/leased.snap`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 || args[0] == "" {
				return usagef(cmd, "expected one FILE")
			}
			return nil
		},
		RunE: a.body(func(cmd *cobra.Command, args []string) error {
			ctx, interrupted, stop := a.interruptible(cmd.Context())
			defer stop()
			n, index, err := a.saveSnapshot(ctx, args[0])
			if err != nil {
				if interrupted() {
					return fmt.Errorf("snapshot save: %w", errInterrupted)
				}
				return err
			}
			if a.jsonOut() {
				return a.emitJSON(map[string]any{"file": args[0], "size_bytes": n, "applied_index": index})
			}
			t := a.newTable("FILE", "SIZE", "APPLIED INDEX")
			t.row(args[0], bytesHuman(n), strconv.FormatUint(index, 10))
			return t.flush()
		}),
	}
	cmd.AddCommand(save)
	return cmd
}

// saveSnapshot writes the snapshot stream to a temporary file next to path, verifies its checksum and
// renames it into place.
func (a *app) saveSnapshot(ctx context.Context, path string) (size int64, index uint64, err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".part-*")
	if err != nil {
		return 0, 0, fmt.Errorf("snapshot save: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	type result struct {
		size  int64
		index uint64
	}
	res, err := clusterCall(ctx, a, "snapshot save", func(ctx context.Context, cc leasepb.ClusterClient) (result, error) {
		if _, err := tmp.Seek(0, io.SeekStart); err != nil {
			return result{}, err
		}
		if err := tmp.Truncate(0); err != nil {
			return result{}, err
		}
		stream, err := cc.Snapshot(ctx, &leasepb.SnapshotRequest{})
		if err != nil {
			return result{}, err
		}
		h := sha256.New()
		w := io.MultiWriter(tmp, h)
		var r result
		for {
			chunk, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				return r, errors.New("stream ended before the last chunk")
			}
			if err != nil {
				return r, err
			}
			if _, err := w.Write(chunk.GetData()); err != nil {
				return r, err
			}
			r.size += int64(len(chunk.GetData()))
			r.index = chunk.GetAppliedIndex()
			if chunk.GetRemainingBytes() == 0 {
				if sum := chunk.GetSha256(); !bytes.Equal(sum, h.Sum(nil)) {
					return r, fmt.Errorf("checksum mismatch: got %x, the server says %x", h.Sum(nil), sum)
				}
				return r, nil
			}
		}
	})
	if err != nil {
		return 0, 0, err
	}
	if err := tmp.Sync(); err != nil {
		return 0, 0, fmt.Errorf("snapshot save: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return 0, 0, fmt.Errorf("snapshot save: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return 0, 0, fmt.Errorf("snapshot save: %w", err)
	}
	return res.size, res.index, nil
}
