package server

import (
	"context"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server/internal/auth"
	"github.com/leased/leased/server/internal/lessor"
	"github.com/leased/leased/server/internal/raftnode"
	"github.com/leased/leased/server/internal/waitq"
)

// leaseOps serves the client requests: the writes (forward.go: validated here, run here if this node
// leads, else forwarded to the leader once) and the lease operations and reads (leases.go). It knows the
// node only through leaseHost and the parts it is handed, so the Ready loop, the state machine and the
// membership stay out of its way, and it out of theirs.
type leaseOps struct {
	leaseHost
	cfg       *Config
	clock     Clock
	id        uint64
	clusterID uint64
	// leader and term are the node's status as the Ready loop last stored it; applied its applied index.
	leader, term func() uint64
	applied      func() uint64
	// leaderChanged wakes forwarded writes when the leader changes (forwardFollowing).
	leaderChanged func() <-chan struct{}
	// done closes when the node stops serving.
	done      <-chan struct{}
	proposals *raftnode.Waiter[fsm.Result]
	queue     *waitq.Queue
	lessor    *lessor.Lessor
	authz     *auth.Authorizer
	metrics   *metrics
	hooks     *testHooks
	// peerClient is the peer connection to a member, for forwarding to the leader.
	peerClient func(id uint64) (wirepb.RaftClient, bool)
	// view takes a view of the state machine to encode outside its lock (consistentSnapshot).
	view func() *fsm.View
}

// leaseHost is what leaseOps needs of the node: raft (proposals, leadership and linearizable reads), the
// state machine (reads, the admission of grants) and the member table (leader hints, forwarders).
type leaseHost interface {
	isLeader() bool
	notLeaderErr() error
	stoppedErr() error
	knownLeader() uint64
	propose(ctx context.Context, cmd *wirepb.Command) (res fsm.Result, index uint64, err error)
	confirmLeadership(ctx context.Context) error
	linearizable(ctx context.Context) error
	readFSM(fn func(sm *fsm.FSM))
	admitGrant(resource, identity string) error
	held(resource string) bool
	member(id uint64) *leasepb.Member
	clientAddrOf(id uint64) string
}

// opsNode adapts the node to leaseHost: the state machine through its owner, the member table through
// membership.
type opsNode struct{ *node }

func (a opsNode) readFSM(fn func(sm *fsm.FSM)) { a.state.Read(fn) }
func (a opsNode) admitGrant(resource, identity string) error {
	return a.state.AdmitGrant(resource, identity)
}
func (a opsNode) held(resource string) bool        { return a.state.Held(resource) }
func (a opsNode) member(id uint64) *leasepb.Member { return a.members.Member(id) }
func (a opsNode) clientAddrOf(id uint64) string    { return a.members.ClientAddrOf(id) }

// newLeaseOps wires n's request serving. The peer transport is looked up per call: it is made after the
// node, and delivers forwarded writes to the leaseOps built here.
func newLeaseOps(n *node) *leaseOps {
	return &leaseOps{
		leaseHost: opsNode{n}, cfg: &n.cfg, clock: n.clock, id: n.id, clusterID: n.clusterID,
		leader: n.raft.Leader, term: n.raft.Term, applied: n.state.Applied, leaderChanged: n.raft.LeaderChanged, done: n.raft.Done(),
		proposals: n.proposals, queue: n.queue, lessor: n.lessor, authz: n.authz, metrics: n.metrics, hooks: &n.hooks,
		peerClient: func(id uint64) (wirepb.RaftClient, bool) { return n.transport.PeerClient(id) },
		view:       n.state.View,
	}
}

// liveLeases is how many leases the state machine holds.
func (o *leaseOps) liveLeases() int {
	live := 0
	o.readFSM(func(sm *fsm.FSM) { live = sm.Len() })
	return live
}

// watchResponses splits events into Watch messages of at most limit bytes of events each (docs/design.md,
// "Watch"): one entry's events — an expiry batch of many leases with large values — may span several
// messages. A single event larger than limit travels alone.
func (o *leaseOps) watchResponses(events []fsm.Event, limit int) []*leasepb.WatchResponse {
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
