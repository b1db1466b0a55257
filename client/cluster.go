package client

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
)

// The Cluster service: node status, Raft membership and snapshots, for operator tools such as leasectl.
// Every call but Status goes through the same leader tracking and retries as the lease calls.

// NodeStatus is one node's report about itself.
type NodeStatus = leasepb.StatusResponse

// Status asks one endpoint about itself (it needs no leader).
func (c *Client) Status(ctx context.Context, endpoint string) (*NodeStatus, error) {
	conn, err := c.endpoints.conn(endpoint)
	if err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.RequestTimeout)
		defer cancel()
	}
	// Connect first, so that a node that cannot be reached says why (refused, name resolution, TLS).
	if err := c.endpoints.ready(ctx, conn); err != nil {
		if errors.Is(err, ErrUnauthenticated) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %s", ErrUnavailable, describeFailure(endpoint, err))
	}
	st, err := leasepb.NewClusterClient(conn).Status(ctx, &leasepb.StatusRequest{})
	if err = wrongService(ctx, conn, endpoint, err); errors.Is(err, ErrNotClientPort) {
		return nil, err
	}
	return st, fromStatus(err)
}

// Endpoints are the configured endpoints.
func (c *Client) Endpoints() []string { return append([]string(nil), c.cfg.Endpoints...) }

// Member is one node of the Raft configuration.
type Member struct {
	// ID is the node's raft id; leasepb.FormatID spells it.
	ID                         uint64
	Name, PeerAddr, ClientAddr string
	// IsLearner: the node receives the log but does not vote (yet).
	IsLearner bool
	// IsLeader: the answering node knows this member as the leader.
	IsLeader bool
}

func membersOf(ms []*leasepb.Member) []Member {
	out := make([]Member, len(ms))
	for i, m := range ms {
		out[i] = Member{ID: m.GetId(), Name: m.GetName(), PeerAddr: m.GetPeerAddr(), ClientAddr: m.GetClientAddr(), IsLearner: m.GetIsLearner(),
			IsLeader: m.GetIsLeader()}
	}
	return out
}

// clusterCall is call for the Cluster service. A FailedPrecondition answer there is a refused membership
// change, not a held resource: it wraps ErrPrecondition.
func clusterCall[T any](ctx context.Context, c *Client, rpc func(context.Context, leasepb.ClusterClient) (T, error)) (T, error) {
	return call(ctx, c, func(ctx context.Context, conn *grpc.ClientConn) (T, error) {
		out, err := rpc(ctx, leasepb.NewClusterClient(conn))
		if st, ok := status.FromError(err); ok && st.Code() == codes.FailedPrecondition {
			return out, fmt.Errorf("%w: %s", ErrPrecondition, st.Message())
		}
		return out, err
	})
}

// membersAnswer is a Cluster response that carries the member table.
type membersAnswer interface {
	GetHeader() *leasepb.ResponseHeader
	GetMembers() []*leasepb.Member
}

// memberCall runs a member RPC and returns the member table it answers with.
func memberCall[R membersAnswer](ctx context.Context, c *Client, rpc func(context.Context, leasepb.ClusterClient) (R, error)) ([]Member, error) {
	resp, err := clusterCall(ctx, c, rpc)
	if err != nil {
		return nil, err
	}
	c.endpoints.follow(resp.GetHeader())
	return membersOf(resp.GetMembers()), nil
}

// MemberList returns the Raft configuration's members.
func (c *Client) MemberList(ctx context.Context, opts ...ReadOption) ([]Member, error) {
	o := readOpts(opts)
	return memberCall(ctx, c, func(ctx context.Context, cc leasepb.ClusterClient) (*leasepb.MemberListResponse, error) {
		return cc.MemberList(ctx, &leasepb.MemberListRequest{Serializable: o.serializable})
	})
}

// MemberAdd adds a node as a non-voting learner and returns the resulting members. clientAddr may be
// empty.
func (c *Client) MemberAdd(ctx context.Context, name, peerAddr, clientAddr string) ([]Member, error) {
	return memberCall(ctx, c, func(ctx context.Context, cc leasepb.ClusterClient) (*leasepb.MemberAddResponse, error) {
		return cc.MemberAdd(ctx, &leasepb.MemberAddRequest{Name: name, PeerAddr: peerAddr, ClientAddr: clientAddr})
	})
}

// MemberPromote makes a caught-up learner a voter and returns the resulting members.
func (c *Client) MemberPromote(ctx context.Context, id uint64) ([]Member, error) {
	return memberCall(ctx, c, func(ctx context.Context, cc leasepb.ClusterClient) (*leasepb.MemberPromoteResponse, error) {
		return cc.MemberPromote(ctx, &leasepb.MemberPromoteRequest{Id: id})
	})
}

// MemberRemove takes a member out of the Raft configuration and returns the remaining members.
func (c *Client) MemberRemove(ctx context.Context, id uint64) ([]Member, error) {
	return memberCall(ctx, c, func(ctx context.Context, cc leasepb.ClusterClient) (*leasepb.MemberRemoveResponse, error) {
		return cc.MemberRemove(ctx, &leasepb.MemberRemoveRequest{Id: id})
	})
}

// SnapshotInfo describes a snapshot Snapshot wrote.
type SnapshotInfo struct {
	// Size is the number of bytes written.
	Size int64
	// AppliedIndex is the last log index the snapshot covers.
	AppliedIndex uint64
}

// ErrChecksum: a snapshot's data does not match the sha256 the server sent with its last chunk.
var ErrChecksum = errors.New("leased: snapshot checksum mismatch")

// snapshotStream is an open Snapshot stream and its first chunk.
type snapshotStream struct {
	stream grpc.ServerStreamingClient[leasepb.SnapshotChunk]
	first  *leasepb.SnapshotChunk
	cancel context.CancelFunc
}

// Snapshot streams a consistent snapshot of the lease state into w and checks the sha256 the server sends
// with the last chunk (an error wrapping ErrChecksum if it differs). Opening the stream, up to its first
// chunk, is bounded like any request and retried on other nodes; after that the stream runs until it ends
// or ctx does, and a failure is returned, not retried (w has been written to). On any error w may hold
// part of a snapshot: write into a temporary file and keep it only on success.
func (c *Client) Snapshot(ctx context.Context, w io.Writer) (SnapshotInfo, error) {
	open, err := call(ctx, c, func(callCtx context.Context, conn *grpc.ClientConn) (snapshotStream, error) {
		// The stream outlives this attempt's deadline once its first chunk arrived.
		streamCtx, cancel := context.WithCancel(ctx)
		stop := context.AfterFunc(callCtx, cancel)
		stream, err := leasepb.NewClusterClient(conn).Snapshot(streamCtx, &leasepb.SnapshotRequest{})
		var first *leasepb.SnapshotChunk
		if err == nil {
			first, err = stream.Recv()
		}
		if !stop() {
			err = callCtx.Err() // the attempt's deadline cancelled the stream
		}
		if err != nil {
			cancel()
			if errors.Is(err, io.EOF) {
				err = errors.New("snapshot stream ended before the first chunk")
			}
			return snapshotStream{}, err
		}
		return snapshotStream{stream: stream, first: first, cancel: cancel}, nil
	})
	if err != nil {
		return SnapshotInfo{}, err
	}
	defer open.cancel()
	h := sha256.New()
	mw := io.MultiWriter(w, h)
	var info SnapshotInfo
	for chunk := open.first; ; {
		n, err := mw.Write(chunk.GetData())
		info.Size += int64(n)
		if err != nil {
			return info, fmt.Errorf("snapshot: %w", err)
		}
		info.AppliedIndex = chunk.GetAppliedIndex()
		if chunk.GetRemainingBytes() == 0 {
			if sum := h.Sum(nil); !bytes.Equal(sum, chunk.GetSha256()) {
				return info, fmt.Errorf("%w: got %x, the server says %x", ErrChecksum, sum, chunk.GetSha256())
			}
			return info, nil
		}
		if chunk, err = open.stream.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return info, errors.New("snapshot stream ended before the last chunk")
			}
			return info, fromStatus(err)
		}
	}
}

// The cluster's ACL (docs/security.md, "Identities and ACLs"): rules in the replicated state, read and
// replaced by identities with admin on the whole cluster. api/acl parses and writes the YAML form.

// ACL returns the cluster's rules and whether any were ever set (a cluster founded without
// --initial-acl-file has none, and with client certificates required refuses every call).
func (c *Client) ACL(ctx context.Context) ([]*leasepb.AclRule, bool, error) {
	resp, err := clusterCall(ctx, c, func(ctx context.Context, cl leasepb.ClusterClient) (*leasepb.AclGetResponse, error) {
		return cl.AclGet(ctx, &leasepb.AclGetRequest{})
	})
	if err != nil {
		return nil, false, err
	}
	c.endpoints.follow(resp.GetHeader())
	return resp.GetRules(), resp.GetSet(), nil
}

// SetACL replaces every rule through the log and returns the index of the entry that set them; each node
// enforces them from when it applies that entry. Replacing rules is idempotent, so the call is retried
// like the lease writes. The server refuses (ErrInvalid) rules that break the limits, or that take admin
// on the whole cluster from the identity setting them.
func (c *Client) SetACL(ctx context.Context, rules []*leasepb.AclRule) (uint64, error) {
	resp, err := clusterCall(ctx, c, func(ctx context.Context, cl leasepb.ClusterClient) (*leasepb.AclSetResponse, error) {
		return cl.AclSet(ctx, &leasepb.AclSetRequest{Rules: rules})
	})
	if err != nil {
		return 0, err
	}
	c.endpoints.follow(resp.GetHeader())
	return resp.GetIndex(), nil
}
