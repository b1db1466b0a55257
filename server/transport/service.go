package transport

import (
	"context"
	"log/slog"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
)

// Register registers the transport's Raft service (Forward and Join, through Config.Forward and
// Config.Join) on s. Create s with ServerOptions. Raft messages do not travel on gRPC: the Listener
// serves them on links.
func (t *Transport) Register(s grpc.ServiceRegistrar) {
	wirepb.RegisterRaftServer(s, t.Service())
}

// Service returns the transport's implementation of the Raft service, for servers that register it
// themselves.
func (t *Transport) Service() wirepb.RaftServer {
	return &service{t: t}
}

// ServerOptions returns the grpc.Server options the peer server needs: a receive limit of
// Config.MaxMsgBytes, and with Config.TLS the
// credentials of connections that Listener secured (mutual TLS refusing certificates naming no member).
// The server must serve Listener's connections.
func (t *Transport) ServerOptions() []grpc.ServerOption {
	var creds []grpc.ServerOption
	if t.cfg.TLS != nil {
		creds = append(creds, grpc.Creds(securedCreds{})) // Listener runs the handshake
	}
	return append(creds,
		grpc.MaxRecvMsgSize(t.cfg.MaxMsgBytes),
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(connWindow),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: t.cfg.KeepAliveTime, Timeout: t.cfg.KeepAliveTimeout}),
		// Every peer pings at KeepAliveTime, streams or not: accept that with room for timer jitter.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: t.cfg.KeepAliveTime / 2, PermitWithoutStream: true}),
	)
}

// service is the server side of the Raft service. It is a separate type so the Transport's own method
// set stays about sending.
type service struct {
	wirepb.UnimplementedRaftServer
	t *Transport
}

var errTransportClosed = status.Error(codes.Unavailable, "raft transport is closed")

// streamLost passes on (Config.OnStreamLost) that the link from peer broke while the transport is
// open; peer 0 (no batch was received) says nothing.
func (t *Transport) streamLost(peer uint64) {
	if peer != 0 && t.ctx.Err() == nil && t.cfg.OnStreamLost != nil {
		t.cfg.OnStreamLost(peer)
	}
}

// deliver checks one batch from a link and hands its messages to raft. member is
// the raft id the connection's certificate names (0: no TLS, nothing to check). An error ends the link.
func (t *Transport) deliver(ctx context.Context, b *wirepb.RaftBatch, member uint64) error {
	if b.GetClusterId() != t.cfg.ClusterID {
		t.stats.rejected.Add(1)
		t.log.Warn("rejecting raft link from another cluster", slog.String("peer", leasepb.FormatID(b.GetFrom())),
			slog.String("cluster", leasepb.FormatID(b.GetClusterId())), slog.String("want_cluster", leasepb.FormatID(t.cfg.ClusterID)))
		return status.Errorf(codes.FailedPrecondition,
			"cluster id mismatch: batch is for cluster %016x, this node (raft id %016x) is in cluster %016x",
			b.GetClusterId(), t.cfg.LocalID, t.cfg.ClusterID)
	}
	if b.GetTo() != t.cfg.LocalID {
		t.stats.rejected.Add(1)
		t.log.Warn("rejecting raft link for another node", slog.String("peer", leasepb.FormatID(b.GetFrom())),
			slog.String("to", leasepb.FormatID(b.GetTo())))
		return status.Errorf(codes.FailedPrecondition,
			"recipient mismatch: batch is for raft id %016x, this node is raft id %016x", b.GetTo(), t.cfg.LocalID)
	}
	if member != 0 && b.GetFrom() != member {
		// A member speaking for another: drop what it says, count it, and keep listening (it may be a
		// bug that a later batch does not repeat; a refusal would only make it reconnect).
		t.rejected(RejectSenderMismatch, len(b.GetMessages()))
		t.log.Warn("dropping raft batch whose sender is not its certificate's member", slog.String("member", leasepb.FormatID(member)),
			slog.String("claimed_from", leasepb.FormatID(b.GetFrom())), slog.Int("messages", len(b.GetMessages())))
		return nil
	}
	for i, raw := range b.GetMessages() {
		m := &raftpb.Message{}
		if err := proto.Unmarshal(raw, m); err != nil {
			t.stats.rejected.Add(1)
			return status.Errorf(codes.InvalidArgument, "message %d of batch from %016x: %v", i, b.GetFrom(), err)
		}
		if m.GetFrom() != b.GetFrom() || m.GetTo() != b.GetTo() {
			t.stats.rejected.Add(1)
			return status.Errorf(codes.InvalidArgument,
				"message %d of batch from %016x to %016x is addressed from %016x to %016x",
				i, b.GetFrom(), b.GetTo(), m.GetFrom(), m.GetTo())
		}
		t.stats.received.Add(1)
		if m.GetType() == raftpb.MsgHeartbeatResp {
			t.heartbeatAnswered(m.GetFrom())
		}
		if err := t.cfg.Raft.Process(ctx, m); err != nil {
			if ctx.Err() != nil {
				if t.ctx.Err() != nil {
					return errTransportClosed
				}
				return status.FromContextError(ctx.Err()).Err()
			}
			// Raft tolerates a lost message; one it refused is no reason to drop the link.
			t.stats.processErrors.Add(1)
			t.log.Debug("raft refused message", slog.String("peer", leasepb.FormatID(m.GetFrom())),
				slog.String("type", m.GetType().String()), slog.Any("err", err))
		}
	}
	return nil
}

// Forward checks the caller (a member, with TLS) and the cluster id, and hands the request to
// Config.Forward, with the caller's member in ctx (Caller).
func (s *service) Forward(ctx context.Context, req *wirepb.ForwardRequest) (*wirepb.ForwardResponse, error) {
	t := s.t
	member, err := t.streamMember(ctx)
	if err != nil {
		return nil, err
	}
	ctx = context.WithValue(ctx, callerKey{}, member)
	if req.GetClusterId() != t.cfg.ClusterID {
		return nil, status.Errorf(codes.FailedPrecondition,
			"cluster id mismatch: request is for cluster %016x, this node (raft id %016x) is in cluster %016x",
			req.GetClusterId(), t.cfg.LocalID, t.cfg.ClusterID)
	}
	if t.cfg.Forward == nil {
		return nil, status.Error(codes.Unimplemented, "this node does not accept forwarded requests")
	}
	return t.cfg.Forward(ctx, req)
}

// Join hands the request to Config.Join, with the caller's member in ctx (Caller). A rejoin retires a
// member's raft id, so with TLS its first hop must come from that member's own certificate (a relayed one
// comes from a member, as every connection does).
func (s *service) Join(ctx context.Context, req *wirepb.JoinRequest) (*wirepb.JoinResponse, error) {
	if s.t.cfg.Join == nil {
		return nil, status.Error(codes.Unimplemented, "this node does not answer joining members")
	}
	member, err := s.t.streamMember(ctx)
	if err != nil {
		return nil, err
	}
	if req.GetRejoin() && !req.GetRelayed() && s.t.cfg.TLS != nil {
		if want, ok := s.t.cfg.MemberID(req.GetName()); !ok || member != want {
			return nil, status.Errorf(codes.PermissionDenied, "a rejoin of member %q must come with that member's certificate", req.GetName())
		}
	}
	return s.t.cfg.Join(context.WithValue(ctx, callerKey{}, member), req)
}

type callerKey struct{}

// Caller is the raft id of the member whose certificate secured the inbound Forward or Join call that
// ctx belongs to: what the call may speak for. 0 without TLS (a plaintext caller has no credential), and
// outside such a call.
func Caller(ctx context.Context) uint64 {
	id, _ := ctx.Value(callerKey{}).(uint64)
	return id
}
