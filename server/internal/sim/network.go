package sim

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/wirepb"
)

// Endpoint is what the network delivers to on a node: raft messages and delivery reports, and requests
// forwarded by followers. Its methods are called from delivery goroutines, concurrently.
type Endpoint interface {
	Process(ctx context.Context, m *raftpb.Message) error
	ReportUnreachable(id uint64)
	ReportSnapshot(id uint64, st raft.SnapshotStatus)
	Forward(ctx context.Context, req *wirepb.ForwardRequest) (*wirepb.ForwardResponse, error)
	Join(ctx context.Context, req *wirepb.JoinRequest) (*wirepb.JoinResponse, error)
}

// Faults are applied to every message on a link that is not cut.
type Faults struct {
	// Drop is the probability that a message is lost.
	Drop float64
	// Each message is delayed by a uniform draw from [MinDelay, MaxDelay]; unequal delays reorder.
	MinDelay, MaxDelay time.Duration
}

// Stats count what the network did with the messages it was given.
type Stats struct {
	Sent, Delivered, Dropped, Cut uint64
}

type linkKey struct{ from, to uint64 }

// Network connects nodes by id. Create it with New; Close it when the nodes have stopped. All methods
// are safe for concurrent use.
type Network struct {
	seed uint64
	ctx  context.Context // cancelled by Close: ends every delivery
	stop context.CancelFunc
	wg   sync.WaitGroup

	mu     sync.Mutex
	faults Faults
	nodes  map[uint64]Endpoint
	cut    map[linkKey]bool
	rngs   map[linkKey]*rand.Rand
	stats  Stats
	tap    func(from uint64, m *raftpb.Message)
}

// New returns a network with no nodes, no faults and no cuts, whose fault draws derive from seed.
func New(seed uint64) *Network {
	ctx, cancel := context.WithCancel(context.Background())
	return &Network{
		seed: seed, ctx: ctx, stop: cancel,
		nodes: make(map[uint64]Endpoint), cut: make(map[linkKey]bool), rngs: make(map[linkKey]*rand.Rand),
	}
}

// Transport returns node id's side of the network, for sending. Nothing is delivered to id until it
// attaches an endpoint.
func (n *Network) Transport(id uint64) *Transport { return &Transport{net: n, id: id} }

// Attach makes node id reachable at ep (replacing an earlier endpoint, after a restart). Messages to an
// id with no endpoint are lost. Attach a node only once it can take messages (its raft exists).
func (n *Network) Attach(id uint64, ep Endpoint) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.nodes[id] = ep
}

// Leave detaches node id's endpoint (it stopped or crashed): what is sent to it from now on is lost.
func (n *Network) Leave(id uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.nodes, id)
}

// Tap calls fn with every message a node sends from now on, before the network decides its fate (nil:
// none). fn runs on the sender's goroutine and must not keep m.
func (n *Network) Tap(fn func(from uint64, m *raftpb.Message)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.tap = fn
}

// SetFaults changes the faults applied from now on.
func (n *Network) SetFaults(f Faults) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.faults = f
}

// CutOneWay loses every message from one node to another until Heal.
func (n *Network) CutOneWay(from, to uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut[linkKey{from, to}] = true
}

// Cut loses every message between a and b, both ways, until Heal.
func (n *Network) Cut(a, b uint64) {
	n.CutOneWay(a, b)
	n.CutOneWay(b, a)
}

// Partition cuts every link between nodes of different groups. Nodes in no group keep their links.
func (n *Network) Partition(groups ...[]uint64) {
	for i, g := range groups {
		for _, h := range groups[i+1:] {
			for _, a := range g {
				for _, b := range h {
					n.Cut(a, b)
				}
			}
		}
	}
}

// Isolate cuts node id off from every other node, both ways, until Heal.
func (n *Network) Isolate(id uint64) {
	for _, other := range n.ids() {
		if other != id {
			n.Cut(id, other)
		}
	}
}

// Heal restores every link. Faults stay as set.
func (n *Network) Heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	clear(n.cut)
}

// Reachable reports whether messages from one node to another currently get through (faults aside).
func (n *Network) Reachable(from, to uint64) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	_, up := n.nodes[to]
	return up && !n.cut[linkKey{from, to}]
}

// Stats returns the counters so far.
func (n *Network) Stats() Stats {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.stats
}

// Close stops every delivery in flight and waits for their goroutines. Later sends are lost.
func (n *Network) Close() {
	n.stop()
	n.wg.Wait()
}

func (n *Network) ids() []uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	ids := make([]uint64, 0, len(n.nodes))
	for id := range n.nodes {
		ids = append(ids, id)
	}
	return ids
}

// rng is the link's own stream: the k-th message on a link always gets the k-th draw.
func (n *Network) rng(k linkKey) *rand.Rand {
	r, ok := n.rngs[k]
	if !ok {
		r = rand.New(rand.NewPCG(n.seed, k.from*0x9e3779b97f4a7c15^k.to))
		n.rngs[k] = r
	}
	return r
}

// route decides one message's fate on a link: lost (ok false), or delivered after delay.
func (n *Network) route(k linkKey) (delay time.Duration, ok bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.stats.Sent++
	r, f := n.rng(k), n.faults
	// Draw both numbers for every message, so that cuts do not shift the link's later draws.
	drop, frac := r.Float64(), r.Float64()
	if n.cut[k] || n.ctx.Err() != nil {
		n.stats.Cut++
		return 0, false
	}
	if drop < f.Drop {
		n.stats.Dropped++
		return 0, false
	}
	if f.MaxDelay > f.MinDelay {
		delay = f.MinDelay + time.Duration(frac*float64(f.MaxDelay-f.MinDelay))
	} else {
		delay = f.MinDelay
	}
	return delay, true
}

// arrive is called when a delayed message reaches the far end: it returns the endpoint if the link is
// (still) up, nil if the message is lost.
func (n *Network) arrive(k linkKey) Endpoint {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cut[k] {
		n.stats.Cut++
		return nil
	}
	ep := n.nodes[k.to]
	if ep != nil {
		n.stats.Delivered++
	}
	return ep
}

func (n *Network) endpoint(id uint64) Endpoint {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.nodes[id]
}

// spawn runs fn on a delivery goroutine that Close waits for; after Close it does nothing.
func (n *Network) spawn(fn func()) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ctx.Err() != nil {
		return
	}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		fn()
	}()
}

// sleep waits d, or until Close; it reports whether the network is still open.
func (n *Network) sleep(d time.Duration) bool {
	if d <= 0 {
		return n.ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-n.ctx.Done():
		return false
	}
}

// Transport is one node's side of the network; it implements the server's peer transport.
type Transport struct {
	net *Network
	id  uint64
}

// Send hands each message to the network without blocking. A lost snapshot is reported as failed and
// a lost message to a cut peer as unreachable, as the real transport does, from another goroutine.
func (t *Transport) Send(msgs []*raftpb.Message) {
	t.net.mu.Lock()
	tap := t.net.tap
	t.net.mu.Unlock()
	for _, m := range msgs {
		to := m.GetTo()
		if to == t.id || to == raft.None {
			continue
		}
		if tap != nil {
			tap(t.id, m)
		}
		m = proto.Clone(m).(*raftpb.Message) // the sender's raft may reuse what it handed out
		k := linkKey{t.id, to}
		delay, ok := t.net.route(k)
		snap := m.GetType() == raftpb.MessageType_MsgSnap
		t.net.spawn(func() {
			if ok && t.net.sleep(delay) {
				if ep := t.net.arrive(k); ep != nil {
					err := ep.Process(t.net.ctx, m)
					if snap {
						t.report(to, err == nil)
					}
					return
				}
			}
			if snap {
				t.report(to, false)
			} else if !t.net.Reachable(t.id, to) {
				t.unreachable(to)
			}
		})
	}
}

func (t *Transport) report(to uint64, ok bool) {
	if self := t.net.endpoint(t.id); self != nil {
		st := raft.SnapshotFinish
		if !ok {
			st = raft.SnapshotFailure
		}
		self.ReportSnapshot(to, st)
	}
}

func (t *Transport) unreachable(to uint64) {
	if self := t.net.endpoint(t.id); self != nil {
		self.ReportUnreachable(to)
	}
}

// AddPeer does nothing: every node that joined the network is addressable by id.
func (t *Transport) AddPeer(uint64, string) {}

// RemovePeer does nothing (see AddPeer).
func (t *Transport) RemovePeer(uint64) {}

// PeerClient returns a client whose Forward runs on peer id's endpoint, if the links both ways are up
// when it is called (else codes.Unavailable, as a broken connection). Only Forward and Join are implemented.
func (t *Transport) PeerClient(id uint64) (wirepb.RaftClient, bool) {
	if id == t.id || id == raft.None {
		return nil, false
	}
	return forwardClient{t: t, to: id}, true
}

type forwardClient struct {
	wirepb.RaftClient // nil: Stream is not used by the node; calling it panics
	t                 *Transport
	to                uint64
}

func (c forwardClient) Forward(ctx context.Context, req *wirepb.ForwardRequest, _ ...grpc.CallOption) (*wirepb.ForwardResponse, error) {
	net := c.t.net
	if !net.Reachable(c.t.id, c.to) || !net.Reachable(c.to, c.t.id) {
		return nil, status.Error(codes.Unavailable, "sim: peer unreachable")
	}
	ep := net.endpoint(c.to)
	if ep == nil {
		return nil, status.Error(codes.Unavailable, "sim: peer unreachable")
	}
	resp, err := ep.Forward(ctx, proto.Clone(req).(*wirepb.ForwardRequest))
	if !net.Reachable(c.to, c.t.id) {
		// The answer is lost on the way back: the outcome is unknown to the caller.
		return nil, status.Error(codes.Unavailable, "sim: peer unreachable")
	}
	if resp != nil {
		resp = proto.Clone(resp).(*wirepb.ForwardResponse)
	}
	return resp, err
}

func (c forwardClient) Join(ctx context.Context, req *wirepb.JoinRequest, _ ...grpc.CallOption) (*wirepb.JoinResponse, error) {
	net := c.t.net
	ep := net.endpoint(c.to)
	if ep == nil || !net.Reachable(c.t.id, c.to) || !net.Reachable(c.to, c.t.id) {
		return nil, status.Error(codes.Unavailable, "sim: peer unreachable")
	}
	resp, err := ep.Join(ctx, proto.Clone(req).(*wirepb.JoinRequest))
	if !net.Reachable(c.to, c.t.id) {
		return nil, status.Error(codes.Unavailable, "sim: peer unreachable")
	}
	if resp != nil {
		resp = proto.Clone(resp).(*wirepb.JoinResponse)
	}
	return resp, err
}
