package rpc

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server/internal/auth"
	"github.com/leased/leased/server/internal/clock"
	"github.com/leased/leased/server/internal/lessor"
	"github.com/leased/leased/server/internal/raftnode"
	"github.com/leased/leased/server/internal/waitq"
	"github.com/leased/leased/server/internal/watch"
)

// LeaseOps serves the client requests: the writes (forward.go: validated here, run here if this node
// leads, else forwarded to the leader once) and the lease operations and reads (leases.go), for the gRPC
// services (service.go, cluster.go), the HTTP gateway and the peer port's Forward. It knows the node only
// through LeaseHost and the parts it is handed (Parts), so the Ready loop, the state machine and the
// membership stay out of its way, and it out of theirs.
type LeaseOps struct {
	LeaseHost
	cfg       Config
	clock     clock.Clock
	id        uint64
	clusterID uint64
	// leader, term and commit are the node's status as the Ready loop last stored it; applied its
	// applied index.
	leader, term, commit func() uint64
	applied              func() uint64
	// leaderChanged is a channel closed when the node's view of the leader next changes
	// (forwardFollowing).
	leaderChanged func() <-chan struct{}
	// done closes when the node stops serving; draining when it begins to shut down.
	done, draining <-chan struct{}
	// proposals answers the blocking acquires a release's entry carried, by proposal id, as the node's own
	// proposers are answered.
	proposals  *raftnode.Waiter[fsm.Result]
	queue      *waitq.Queue
	lessor     *lessor.Lessor
	authz      *auth.Authorizer
	watch      *watch.Hub
	metrics    *Metrics
	members    Members
	nodeStatus func() *leasepb.StatusResponse
	log        *slog.Logger
	// handoffProposing, set only by tests, runs between a release's claim of a waiter and its proposal.
	handoffProposing *atomic.Pointer[func()]
	// peerClient is the peer connection to a member, for forwarding to the leader.
	peerClient func(id uint64) (wirepb.RaftClient, bool)
	// view takes a view of the state machine to encode outside its lock (consistentSnapshot).
	view func() *fsm.View
}

// LeaseHost is what LeaseOps needs of the node: raft (proposals, leadership and linearizable reads), the
// state machine (reads, the admission of grants) and the member table (leader hints, forwarders).
type LeaseHost interface {
	IsLeader() bool
	NotLeaderErr() error
	StoppedErr() error
	KnownLeader() uint64
	Propose(ctx context.Context, cmd *wirepb.Command) (res fsm.Result, index uint64, err error)
	ConfirmLeadership(ctx context.Context) error
	Linearizable(ctx context.Context) error
	ReadFSM(fn func(sm *fsm.FSM))
	AdmitGrant(resource, identity string) error
	Held(resource string) bool
	Member(id uint64) *leasepb.Member
	ClientAddrOf(id uint64) string
}

// Members is what the Cluster service needs of the member table (internal/membership).
type Members interface {
	Table() []*leasepb.Member
	Add(ctx context.Context, name, peerAddr, clientAddr string) (*leasepb.Member, error)
	Promote(ctx context.Context, id uint64) error
	Remove(ctx context.Context, id uint64) error
}

// Config is what the request path needs of the node's configuration.
type Config struct {
	// Limits are the limits the edge enforces, MinTTL resolved (Explained).
	Limits         Limits
	ClientCertAuth bool
	// PeerTLS: the peer port runs TLS, so forwarded writes may carry client identities (forwardCaller).
	PeerTLS         bool
	ElectionTimeout time.Duration
}

// Parts are the node's parts the request path uses; each field is documented on LeaseOps.
type Parts struct {
	Host                 LeaseHost
	Clock                clock.Clock
	ID, ClusterID        uint64
	Leader, Term, Commit func() uint64
	Applied              func() uint64
	// Proposals is the node's proposal waiter: the apply answers a carried acquire by its id, and a lost
	// leadership fails it with the node's other proposers.
	Proposals      *raftnode.Waiter[fsm.Result]
	LeaderChanged  func() <-chan struct{}
	Done, Draining <-chan struct{}
	Queue          *waitq.Queue
	Lessor         *lessor.Lessor
	Authz          *auth.Authorizer
	Watch          *watch.Hub
	Metrics        *Metrics
	Members        Members
	// Status is the node's status for the Cluster service's Status, less its header and live leases.
	Status           func() *leasepb.StatusResponse
	Log              *slog.Logger
	HandoffProposing *atomic.Pointer[func()]
	PeerClient       func(id uint64) (wirepb.RaftClient, bool)
	View             func() *fsm.View
}

// New wires the request path of a node.
func New(cfg Config, p Parts) *LeaseOps {
	return &LeaseOps{
		LeaseHost: p.Host, cfg: cfg, clock: p.Clock, id: p.ID, clusterID: p.ClusterID,
		leader: p.Leader, term: p.Term, commit: p.Commit, applied: p.Applied, leaderChanged: p.LeaderChanged,
		done: p.Done, draining: p.Draining, proposals: p.Proposals, queue: p.Queue, lessor: p.Lessor,
		authz: p.Authz, watch: p.Watch, metrics: p.Metrics, members: p.Members, nodeStatus: p.Status, log: p.Log,
		handoffProposing: p.HandoffProposing, peerClient: p.PeerClient, view: p.View,
	}
}

// LiveLeases is how many leases the state machine holds.
func (o *LeaseOps) LiveLeases() int {
	live := 0
	o.ReadFSM(func(sm *fsm.FSM) { live = sm.Len() })
	return live
}

// watchResponses splits events into Watch messages of at most limit bytes of events each (docs/design.md,
// "Watch"): one entry's events — an expiry batch of many leases with large values — may span several
// messages. A single event larger than limit travels alone.
func (o *LeaseOps) watchResponses(events []fsm.Event, limit int) []*leasepb.WatchResponse {
	var (
		out  []*leasepb.WatchResponse
		cur  *leasepb.WatchResponse
		size int
	)
	for _, e := range events {
		pe := e.Proto()
		sz := protowire.SizeBytes(proto.Size(pe)) + 1 // the events field: tag, length, event
		if cur == nil || size+sz > limit && len(cur.Events) > 0 {
			cur, size = &leasepb.WatchResponse{Header: o.header()}, 0
			out = append(out, cur)
		}
		cur.Events = append(cur.Events, pe)
		size += sz
	}
	return out
}
