package server

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/raftlog"
	"github.com/leased/leased/server/internal/clock"
	"github.com/leased/leased/server/internal/ids"
	"github.com/leased/leased/server/internal/membership"
	"github.com/leased/leased/server/internal/rpc"
	"github.com/leased/leased/server/internal/sim"
)

// The simulation harness: whole nodes (raft, state machine, lessor, wait queue, watch hub, ReadIndex,
// the Leases service's forwarding) built by newServer on an in-memory log (sim.Storage) and an in-memory
// seeded network (sim.Network), with no sockets and no disk, inside a testing/synctest bubble: time.Now,
// tickers, timers and sleeps are virtual, so elections and TTLs take no real time. The seed is printed;
// LEASED_SIM_SEED=<seed> replays its fault schedule and workload (docs/testing.md). LEASED_SIM_LOG=1
// sends the nodes' logs to the test output.

// simSeed is LEASED_SIM_SEED, or a fresh random seed.
func simSeed(t *testing.T) uint64 {
	if s := os.Getenv("LEASED_SIM_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("LEASED_SIM_SEED=%q: %v", s, err)
		}
		return seed
	}
	return rand.Uint64()
}

// simConfig is TestConfig with ticks slow enough that a few virtual minutes cost little real time.
func simConfig() Config {
	cfg := TestConfig()
	cfg.TickInterval = 20 * time.Millisecond
	cfg.ElectionTicks = 10
	cfg.HeartbeatTicks = 1
	return cfg
}

// runSim runs body against a fresh cluster of size nodes inside a synctest bubble, and closes the
// cluster (every goroutine it started ends) when body returns or fails.
func runSim(t *testing.T, size int, mutate func(*Config), body func(t *testing.T, c *simCluster)) {
	seed := simSeed(t)
	t.Logf("sim seed %d (replay: LEASED_SIM_SEED=%d go test -run '^%s$' ./server/)", seed, seed, t.Name())
	synctest.Test(t, func(t *testing.T) {
		c := newSimCluster(t, seed, size, mutate)
		defer c.close()
		body(t, c)
	})
}

// simCluster is a cluster of nodes on one sim.Network. Node i keeps its log across stop and start.
type simCluster struct {
	t    *testing.T
	seed uint64
	rng  *rand.Rand // the test's own choices (schedule, workload), drawn from the seed
	net  *sim.Network
	cfgs []Config
	ids  []raftlog.Identity
	logs []*sim.Storage

	mu    sync.Mutex
	nodes []*Server // nil while stopped
}

func newSimCluster(t *testing.T, seed uint64, size int, mutate func(*Config)) *simCluster {
	c := &simCluster{
		t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, 0x51)), net: sim.New(seed),
		nodes: make([]*Server, size),
	}
	initial := map[string]string{}
	for i := range size {
		initial[fmt.Sprintf("n%d", i+1)] = fmt.Sprintf("sim:n%d", i+1)
	}
	logger := slog.New(slog.DiscardHandler)
	if os.Getenv("LEASED_SIM_LOG") != "" {
		logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	cid := ids.Cluster(initial)
	for i := range size {
		cfg := simConfig()
		cfg.Name = fmt.Sprintf("n%d", i+1)
		cfg.DataDir = "sim:" + cfg.Name // never opened
		cfg.ClientAddr, cfg.PeerAddr = "sim:client:"+cfg.Name, initial[cfg.Name]
		cfg.InsecurePeer = true // an in-memory network: no port is ever opened
		cfg.InitialCluster = initial
		cfg.Logger = logger.With("sim", cfg.Name)
		cfg.Clock = clock.Real{} // virtual inside the bubble
		if mutate != nil {
			mutate(&cfg)
		}
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		c.cfgs = append(c.cfgs, cfg)
		c.ids = append(c.ids, raftlog.Identity{ClusterID: cid, NodeID: ids.Member(cid, cfg.Name)})
		c.logs = append(c.logs, sim.NewStorage())
	}
	for i := range size {
		c.start(i)
	}
	return c
}

// simEndpoint is a node as the network sees it: raft (as the real transport hands it messages) and the
// forward handler.
type simEndpoint struct{ raftAdapter }

func (e simEndpoint) Forward(ctx context.Context, req *wirepb.ForwardRequest) (*wirepb.ForwardResponse, error) {
	return e.n.ops.ServeForward(ctx, req)
}

func (e simEndpoint) Join(ctx context.Context, req *wirepb.JoinRequest) (*wirepb.JoinResponse, error) {
	return e.n.members.ServeJoin(ctx, req)
}

// start builds node i on its log (empty, or what it had persisted when it stopped) and starts it.
func (c *simCluster) start(i int) {
	c.t.Helper()
	s, err := newServer(c.cfgs[i], c.ids[i], c.logs[i], func(n *node) (peerTransport, error) {
		return c.net.Transport(n.id), nil
	}, nil)
	if err != nil {
		c.t.Fatalf("start %s: %v", c.cfgs[i].Name, err)
	}
	c.net.Attach(c.id(i), simEndpoint{raftAdapter{s.node}}) // as a real node starts serving peers
	s.Start()
	c.mu.Lock()
	c.nodes[i] = s
	c.mu.Unlock()
}

// stop closes node i as Server.Close does (a leader hands over first); crash first cuts it off, so it
// cannot.
func (c *simCluster) stop(i int, crash bool) {
	if crash {
		c.net.Leave(c.id(i))
	}
	s := c.server(i)
	c.mu.Lock()
	c.nodes[i] = nil // callers see it stopped from now on
	c.mu.Unlock()
	if err := s.Close(); err != nil {
		c.t.Errorf("close %s: %v", c.cfgs[i].Name, err)
	}
	c.net.Leave(c.id(i))
}

func (c *simCluster) close() {
	for i := range c.nodes {
		if c.server(i) != nil {
			c.stop(i, false)
		}
	}
	c.net.Close()
	c.t.Logf("network: %+v", c.net.Stats())
}

func (c *simCluster) id(i int) uint64     { return c.ids[i].NodeID }
func (c *simCluster) node(i int) *node    { return c.server(i).node }
func (c *simCluster) size() int           { return len(c.nodes) }
func (c *simCluster) tick() time.Duration { return c.cfgs[0].TickInterval }

func (c *simCluster) index(id uint64) int {
	for i := range c.ids {
		if c.ids[i].NodeID == id {
			return i
		}
	}
	return -1
}

// server is node i, or nil while it is stopped.
func (c *simCluster) server(i int) *Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i]
}

// running lists the nodes not stopped.
func (c *simCluster) running() map[int]*node {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[int]*node{}
	for i, s := range c.nodes {
		if s != nil {
			out[i] = s.node
		}
	}
	return out
}

// leases is node i's Leases service, called directly: validation, forwarding and status mapping as a
// gRPC client would see them; nil while node i is stopped.
func (c *simCluster) leases(i int) *rpc.LeasesService {
	if s := c.server(i); s != nil {
		return rpc.NewLeasesService(s.node.ops)
	}
	return nil
}

// leader is the running node that leads in the highest term and that a majority of the nodes follow,
// or -1.
func (c *simCluster) leader() int {
	best, bestTerm := -1, uint64(0)
	nodes := c.running()
	for i, n := range nodes {
		if n.raft.IsLeader() && n.raft.Term() >= bestTerm {
			best, bestTerm = i, n.raft.Term()
		}
	}
	if best < 0 {
		return -1
	}
	follow := 0
	for _, n := range nodes {
		if n.raft.Leader() == c.id(best) && n.raft.Term() == bestTerm {
			follow++
		}
	}
	if follow <= c.size()/2 {
		return -1
	}
	return best
}

// waitFor polls cond every tick of virtual time until it holds, or fails the test after within.
func (c *simCluster) waitFor(within time.Duration, what string, cond func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			c.t.Fatalf("no %s within %v (virtual)", what, within)
		}
		time.Sleep(c.tick())
	}
}

// waitLeader waits for a leader that a majority follows and that has applied an entry of its term.
func (c *simCluster) waitLeader(within time.Duration) int {
	c.t.Helper()
	l := -1
	c.waitFor(within, "leader", func() bool {
		l = c.leader()
		if l < 0 {
			return false
		}
		n := c.node(l)
		return n.state.Applied() >= n.raft.Commit() && n.raft.Commit() > 0
	})
	return l
}

// retryable are the answers after which a client retries (the SDK does): no leader, unreachable, timeout.
func retryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return true
	}
	return false
}

// acquire calls Acquire on node i, with a per-call timeout, retrying retryable answers with the same
// request id (through node pick(attempt)) until ctx ends.
func (c *simCluster) acquire(ctx context.Context, pick func(attempt int) int, req *leasepb.AcquireRequest) (*leasepb.AcquireResponse, error) {
	for attempt := 0; ; attempt++ {
		i := pick(attempt)
		var (
			resp *leasepb.AcquireResponse
			err  = status.Error(codes.Unavailable, "node stopped")
		)
		if c.server(i) != nil {
			callCtx, cancel := context.WithTimeout(ctx, time.Second)
			resp, err = c.leases(i).Acquire(callCtx, req)
			cancel()
		}
		if !retryable(err) || ctx.Err() != nil {
			return resp, err
		}
		time.Sleep(c.tick())
	}
}

// fsmState is node i's applied index and state-machine snapshot, read together.
func (c *simCluster) fsmState(i int) (index uint64, data []byte) {
	var err error
	c.node(i).state.Read(func(sm *fsm.FSM) {
		data, err = sm.Snapshot()
		index = sm.AppliedIndex()
	})
	if err != nil {
		c.t.Fatal(err)
	}
	return index, data
}

// holds reports node i's state-machine view of resource: the live grant's token, or 0.
func (c *simCluster) holds(i int, resource string) uint64 {
	var tok uint64
	c.node(i).state.Read(func(sm *fsm.FSM) {
		if l, ok := sm.Get(resource); ok {
			tok = l.Token
		}
	})
	return tok
}

// converge waits until every running node has applied the same index, and fails if their states at
// that index differ by a byte (determinism, and no divergent logs). It returns that index.
func (c *simCluster) converge(within time.Duration) uint64 {
	c.t.Helper()
	var at uint64
	c.waitFor(within, "convergence of every node's state machine", func() bool {
		synctest.Wait() // let every node finish what this instant started
		var first []byte
		for i := range c.running() {
			idx, data := c.fsmState(i)
			if first == nil {
				at, first = idx, data
				continue
			}
			if idx != at {
				return false
			}
			if !bytes.Equal(data, first) {
				c.t.Fatalf("%s's state at index %d differs from another node's at the same index", c.cfgs[i].Name, idx)
			}
		}
		return true
	})
	return at
}

// grantRecord is one GRANTED event found by replaying a log.
type grantRecord struct {
	resource, holder, requestID string
}

// replayLog replays node i's raft log, from its first entry to index upTo, on a fresh state machine and
// checks I1 and I2 on the way: every grant's token is its index, larger than every earlier token of its
// resource; no resource is granted while a grant is live; only the live grant ends. It fails the test if
// the log was compacted (use a large SnapshotEntries) and returns the grants by token and the final
// snapshot.
func (c *simCluster) replayLog(i int, upTo uint64) (map[uint64]grantRecord, []byte) {
	c.t.Helper()
	st := c.logs[i]
	if first, _ := st.FirstIndex(); first != 1 {
		c.t.Fatalf("%s's log was compacted (first index %d): raise SnapshotEntries", c.cfgs[i].Name, first)
	}
	ents, err := st.Entries(1, upTo+1, 1<<62)
	if err != nil {
		c.t.Fatal(err)
	}
	sm := fsm.New()
	sm.SetClusterID(c.ids[i].ClusterID) // as the node records it
	grants := map[uint64]grantRecord{}
	live := map[string]uint64{}
	highest := map[string]uint64{}
	for _, e := range ents {
		idx := e.GetIndex()
		if e.GetType() != raftpb.EntryType_EntryNormal {
			cc, err := membership.DecodeConfChange(e)
			if err == nil {
				err = sm.ApplyMembers(idx, membership.MemberChanges(cc.AsV2()))
			}
			if err != nil {
				c.t.Fatal(err)
			}
			continue
		}
		if len(e.GetData()) == 0 {
			if err := sm.Advance(idx); err != nil {
				c.t.Fatal(err)
			}
			continue
		}
		res, err := sm.ApplyEntry(idx, e.GetData())
		if err != nil {
			c.t.Fatalf("entry %d: %v", idx, err)
		}
		for _, ev := range res.Events {
			r, tok := ev.Lease.Resource, ev.Lease.Token
			switch ev.Type {
			case leasepb.EventType_EVENT_TYPE_GRANTED:
				if tok != idx {
					c.t.Fatalf("I1: grant of %s at index %d carries token %d", r, idx, tok)
				}
				if tok <= highest[r] {
					c.t.Fatalf("I1: grant of %s with token %d after token %d", r, tok, highest[r])
				}
				if prev, ok := live[r]; ok {
					c.t.Fatalf("I2: %s granted at %d while token %d is live", r, idx, prev)
				}
				live[r], highest[r] = tok, tok
				grants[tok] = grantRecord{resource: r, holder: ev.Lease.Holder, requestID: ev.Lease.RequestID}
			case leasepb.EventType_EVENT_TYPE_RELEASED, leasepb.EventType_EVENT_TYPE_EXPIRED:
				if live[r] != tok {
					c.t.Fatalf("I2: %v of %s token %d at index %d, but the live token is %d", ev.Type, r, tok, idx, live[r])
				}
				delete(live, r)
			}
		}
	}
	data, err := sm.Snapshot()
	if err != nil {
		c.t.Fatal(err)
	}
	return grants, data
}
