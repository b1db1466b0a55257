package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"

	"github.com/leased/leased/api/wirepb"
)

// Raft is what the transport needs of the local raft node. The server's node implements it.
//
// Concurrency: every method is called from transport goroutines, never from the goroutine that calls
// Send. Process is called by one goroutine per inbound link, so calls from different peers run
// concurrently with each other and with the report methods; calls for one inbound link are sequential,
// in the order the peer sent the messages. ReportUnreachable and ReportSnapshot are called from a single
// reporting goroutine, one call at a time. Implementations must not call back into the Transport's
// AddPeer, UpdatePeer, RemovePeer or Close from these methods (Send is fine).
type Raft interface {
	// Process hands one message received from a peer to raft (typically node.Step). It may block to
	// apply backpressure to the sending peer; ctx is cancelled when the link ends or the transport
	// closes. An error is logged and the message dropped; the link goes on.
	Process(ctx context.Context, m *raftpb.Message) error
	// ReportUnreachable tells raft that recent messages to peer id were dropped or failed, so the
	// leader stops pipelining to it and probes instead. Reports are coalesced: one call may stand for
	// many dropped messages.
	ReportUnreachable(id uint64)
	// ReportSnapshot tells raft whether a MsgSnap to peer id was sent (SnapshotFinish) or dropped
	// (SnapshotFailure). Every MsgSnap handed to Send before Close gets exactly one report.
	ReportSnapshot(id uint64, status raft.SnapshotStatus)
}

// ForwardFunc runs a follower's forwarded client request on this node; see Config.Forward.
type ForwardFunc func(ctx context.Context, req *wirepb.ForwardRequest) (*wirepb.ForwardResponse, error)

// JoinFunc answers a member asking about itself; see Config.Join.
type JoinFunc func(ctx context.Context, req *wirepb.JoinRequest) (*wirepb.JoinResponse, error)

// Config configures a Transport. Zero durations and sizes take the defaults listed on each field.
type Config struct {
	// ClusterID is stamped on every outgoing batch; inbound batches and Forward requests that carry a
	// different cluster id are refused with FailedPrecondition.
	ClusterID uint64
	// LocalID is this node's raft id (non-zero). Inbound batches addressed to another id are rejected.
	LocalID uint64
	// Raft receives inbound messages and delivery reports. Required.
	Raft Raft
	// Forward serves the Raft.Forward RPC. Nil answers Unimplemented. Requests whose cluster id is not
	// ClusterID are rejected before Forward is called.
	Forward ForwardFunc
	// Join serves the Raft.Join RPC. Nil answers Unimplemented. A new member asks before it knows the
	// cluster id, so none is checked here; with TLS the caller must hold a member certificate, and
	// Caller(ctx) tells Join (and Forward) which member it is.
	Join JoinFunc
	// Logger receives the transport's logs; nil discards them.
	Logger *slog.Logger
	// DialOptions are appended to the transport's own options for its gRPC connections (message size
	// limits and a reconnect backoff matching BackoffMin/BackoffMax; insecure credentials unless TLS is
	// set), so they can override them. Links do not use them.
	DialOptions []grpc.DialOption
	// TLS, when set, is mutual TLS on both sides of every peer connection: ServerOptions serve it and
	// require a client certificate, and dials present one. It must verify the other side's chain (a
	// RootCAs pool, or its own VerifyConnection with InsecureSkipVerify, as tlsfiles.Source.PeerConfig
	// does); the transport adds the identity check on top: a certificate names a member by its CN or a
	// DNS SAN, the member name must be known to MemberID, and the member a dial reaches must be the peer
	// dialed. A connection whose certificate names no member is refused at the handshake, and inbound
	// batches whose sender is not the certificate's member are dropped (OnRejected, "sender_mismatch").
	// nil is plaintext.
	TLS *tls.Config
	// AllowedCNs and AllowedHostnames, when not empty, narrow the certificates TLS accepts from peers,
	// both ways (etcd's --peer-cert-allowed-cn and --peer-cert-allowed-hostname): the certificate's CN
	// must be one of AllowedCNs, and it must be valid (x509 VerifyHostname: a DNS or IP SAN) for one of
	// AllowedHostnames. On top of them, a peer certificate must always list both the serverAuth and the
	// clientAuth extended key usages, and name a member.
	AllowedCNs       []string
	AllowedHostnames []string
	// MemberID maps a member name, as certificates carry it, to the member's raft id (ok false: not a
	// member). Required with TLS. It is called on every handshake, from gRPC goroutines: it must be fast
	// and safe for concurrent use. The server answers from its member table, so a member added or
	// removed later is recognised or refused from then on.
	MemberID func(name string) (id uint64, ok bool)
	// OnRejected, when set, hears of inbound messages dropped because of who sent them (reason
	// "sender_mismatch": the batch's sender is not the member its certificate names). Same rules as
	// OnDropped.
	OnRejected func(reason string, count int)
	// QueueSize is how many messages wait per peer before Send starts dropping. Default 4096.
	QueueSize int
	// MaxBatchBytes and MaxBatchMessages cap one RaftBatch. A single message larger than MaxBatchBytes
	// still travels, alone. Defaults 4 MiB and 1024.
	MaxBatchBytes    int
	MaxBatchMessages int
	// BackoffMin and BackoffMax bound the jittered exponential delay between reconnect attempts to a
	// peer. Defaults 50ms and 2s.
	BackoffMin time.Duration
	BackoffMax time.Duration
	// DialTimeout bounds one attempt to connect to a peer (TCP, a proxy's CONNECT, with TLS the handshake,
	// and a link's hello), and how long the Listener waits for an accepted connection to say what it is.
	// Messages queued meanwhile wait, or are dropped once the queue is full. Default 5s.
	DialTimeout time.Duration
	// KeepAliveTime is how often a link is pinged, and how long a gRPC peer connection may be idle before
	// it is pinged (both ways: the dialing side and, through ServerOptions, the serving side);
	// KeepAliveTimeout how long a gRPC ping's answer may take before the connection is closed and
	// redialed. A link whose ping is unanswered at the next ping is closed and redialed, and a receiver
	// closes a link silent for 2×KeepAliveTime + KeepAliveTimeout. So a black-holed connection is noticed
	// within seconds instead of when TCP gives up (many minutes). gRPC pings are accepted down to half
	// KeepAliveTime. Defaults 10s (gRPC's floor for a dialing side) and 5s.
	KeepAliveTime    time.Duration
	KeepAliveTimeout time.Duration
	// MaxMsgBytes is the largest batch sent or received, on a link or as a gRPC message; raft snapshots
	// travel inside MsgSnap, so it bounds the snapshot size. A message that cannot fit is dropped (and
	// reported); a link whose frame is larger is refused. Default 256 MiB. The receiving grpc.Server
	// must accept it too: create it with ServerOptions.
	MaxMsgBytes int
	// Filter, when set, is asked about every outgoing message in Send; a message for which it returns
	// false is dropped as if the network lost it (a MsgSnap is reported as SnapshotFailure). It is a fault
	// hook for tests that cut links between in-process nodes. It runs inside Send, so it must be fast, safe
	// for concurrent use, and must not call the Transport.
	Filter func(m *raftpb.Message) bool
	// OnRoundTrip, when set, hears the round-trip time to a peer: from a heartbeat handed to Send to the
	// arrival of that peer's heartbeat response (the oldest heartbeat not yet answered; one lost with a
	// dropped message, or older than maxRoundTrip, is forgotten). OnDropped, when set, hears of messages
	// to a peer that could not be sent (counted in Stats.Dropped; not those Filter drops, nor those sent
	// after Close). Both run on transport goroutines and inside Send: they must be fast, safe for
	// concurrent use, and must not call the Transport. The server turns them into per-peer metrics.
	OnRoundTrip func(peer uint64, rtt time.Duration)
	OnDropped   func(peer uint64, count int)
	// OnStreamLost, when set, hears that a peer's link to this node broke: it ended
	// without the peer's bye (the connection reset or closed under it, as when the peer's process dies)
	// rather than the peer closing it, while this transport is open. peer is the sender of the link's
	// batches. It is a hint, not a verdict: a live peer reopens its link at once. Same rules as
	// OnRoundTrip.
	OnStreamLost func(peer uint64)
}

// Defaults for the zero fields of Config.
const (
	DefaultQueueSize        = 4096
	DefaultMaxBatchBytes    = 4 << 20
	DefaultMaxBatchMessages = 1024
	DefaultBackoffMin       = 50 * time.Millisecond
	DefaultBackoffMax       = 2 * time.Second
	DefaultMaxMsgBytes      = 256 << 20
	DefaultDialTimeout      = 5 * time.Second
	DefaultKeepAliveTime    = 10 * time.Second
	DefaultKeepAliveTimeout = 5 * time.Second
)

// The flow-control windows of the peer gRPC connections (Forward, Join), both ways. Setting them turns
// off gRPC's bandwidth-delay estimator, which otherwise answers nearly every message on a lightly loaded
// connection with a window update and a PING, and the sender with a PING ack: two more writes, and the
// reads and wake-ups they cause, per forwarded request. Fixed windows of this size let a stream carry
// 400 MB/s at a 10 ms round trip, and bound what an unread connection can buffer below the estimator's
// own ceiling (16 MiB).
const (
	streamWindow = 4 << 20
	connWindow   = 8 << 20
)

// batchOverhead is room left in MaxMsgBytes for the RaftBatch framing around one message: three
// uint64 fields plus a length-prefixed bytes field.
const batchOverhead = 64

// Validate reports the first problem with c, after defaults are applied.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.LocalID == 0:
		return errors.New("local id must be non-zero")
	case c.Raft == nil:
		return errors.New("raft is required")
	case c.QueueSize < 1:
		return fmt.Errorf("queue size %d must be positive", c.QueueSize)
	case c.MaxBatchMessages < 1:
		return fmt.Errorf("max batch messages %d must be positive", c.MaxBatchMessages)
	case c.MaxBatchBytes < 1:
		return fmt.Errorf("max batch bytes %d must be positive", c.MaxBatchBytes)
	case c.BackoffMin <= 0 || c.BackoffMax < c.BackoffMin:
		return fmt.Errorf("backoff range [%v, %v] is invalid", c.BackoffMin, c.BackoffMax)
	case c.DialTimeout <= 0:
		return fmt.Errorf("dial timeout %v must be positive", c.DialTimeout)
	case c.KeepAliveTime <= 0 || c.KeepAliveTimeout <= 0:
		return fmt.Errorf("keepalive time %v and timeout %v must be positive", c.KeepAliveTime, c.KeepAliveTimeout)
	case c.TLS != nil && c.MemberID == nil:
		return errors.New("TLS needs MemberID to tell which member a certificate names")
	case c.MaxMsgBytes <= batchOverhead:
		return fmt.Errorf("max message bytes %d is too small", c.MaxMsgBytes)
	}
	return nil
}

// withDefaults returns c with every zero field that has a default set to it. Negative values are left
// alone so Validate can reject them.
func (c Config) withDefaults() Config {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.QueueSize == 0 {
		c.QueueSize = DefaultQueueSize
	}
	if c.MaxBatchBytes == 0 {
		c.MaxBatchBytes = DefaultMaxBatchBytes
	}
	if c.MaxBatchMessages == 0 {
		c.MaxBatchMessages = DefaultMaxBatchMessages
	}
	if c.BackoffMin == 0 {
		c.BackoffMin = DefaultBackoffMin
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = max(DefaultBackoffMax, c.BackoffMin)
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.MaxMsgBytes == 0 {
		c.MaxMsgBytes = DefaultMaxMsgBytes
	}
	if c.KeepAliveTime == 0 {
		c.KeepAliveTime = DefaultKeepAliveTime
	}
	if c.KeepAliveTimeout == 0 {
		c.KeepAliveTimeout = DefaultKeepAliveTimeout
	}
	return c
}
