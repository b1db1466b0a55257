package server

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/leased/leased/api/leasepb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testCluster is an in-process cluster of real nodes talking gRPC on loopback.
type testCluster struct {
	t       testing.TB
	mu      sync.Mutex // guards nodes and clients, which restarts replace while workers use them
	cfgs    []Config
	nodes   []*Server
	clients []*grpc.ClientConn
}

func newTestCluster(t *testing.T, size int, mutate func(*Config)) *testCluster {
	t.Helper()
	return newTestClusterTB(t, size, mutate)
}

func newTestClusterTB(t testing.TB, size int, mutate func(*Config)) *testCluster {
	t.Helper()
	c := &testCluster{t: t, nodes: make([]*Server, size), clients: make([]*grpc.ClientConn, size)}
	initial := map[string]string{}
	var lis []Listeners
	for i := range size {
		l := Listeners{Client: listen(t, "127.0.0.1:0"), Peer: listen(t, "127.0.0.1:0")}
		lis = append(lis, l)
		initial[fmt.Sprintf("n%d", i+1)] = l.Peer.Addr().String()
	}
	dir := t.TempDir()
	for i := range size {
		cfg := TestConfig()
		cfg.Name = fmt.Sprintf("n%d", i+1)
		cfg.DataDir = filepath.Join(dir, cfg.Name)
		cfg.ClientAddr, cfg.PeerAddr = lis[i].Client.Addr().String(), lis[i].Peer.Addr().String()
		cfg.InitialCluster = initial
		if mutate != nil {
			mutate(&cfg)
		}
		c.cfgs = append(c.cfgs, cfg)
	}
	for i := range size {
		c.startNode(i, lis[i])
	}
	t.Cleanup(c.close)
	c.waitSettled()
	return c
}

// waitSettled waits for a leader and for every running node to have applied what the leader applied.
func (c *testCluster) waitSettled() {
	c.t.Helper()
	leader := c.running()[c.waitLeader()]
	eventually(c.t, 10*time.Second, "nodes to catch up", func() bool {
		want := leader.AppliedIndex()
		for _, s := range c.running() {
			if s != nil && s.AppliedIndex() < want {
				return false
			}
		}
		return want > 0
	})
}

func listen(t testing.TB, addr string) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func (c *testCluster) startNode(i int, lis Listeners) {
	c.t.Helper()
	s, err := New(c.cfgs[i], lis)
	if err != nil {
		c.t.Fatalf("start %s: %v", c.cfgs[i].Name, err)
	}
	s.Start()
	conn, err := grpc.NewClient(s.ClientAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		c.t.Fatal(err)
	}
	c.mu.Lock()
	c.nodes[i], c.clients[i] = s, conn
	c.mu.Unlock()
}

// stopNode closes node i (a clean shutdown).
func (c *testCluster) stopNode(i int) {
	c.t.Helper()
	c.mu.Lock()
	s, conn := c.nodes[i], c.clients[i]
	c.nodes[i], c.clients[i] = nil, nil
	c.mu.Unlock()
	if conn != nil {
		_ = conn.Close()
	}
	if s != nil {
		if err := s.Close(); err != nil {
			c.t.Errorf("close %s: %v", c.cfgs[i].Name, err)
		}
	}
}

// restartNode starts node i again on its data dir and addresses.
func (c *testCluster) restartNode(i int) {
	c.t.Helper()
	var lis Listeners
	deadline := time.Now().Add(5 * time.Second)
	for {
		cl, err1 := net.Listen("tcp", c.cfgs[i].ClientAddr)
		pl, err2 := net.Listen("tcp", c.cfgs[i].PeerAddr)
		if err1 == nil && err2 == nil {
			lis = Listeners{Client: cl, Peer: pl}
			break
		}
		for _, l := range []net.Listener{cl, pl} {
			if l != nil {
				_ = l.Close()
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("rebind %s: %v %v", c.cfgs[i].Name, err1, err2)
		}
		time.Sleep(20 * time.Millisecond) // the port is still being released; retry binding
	}
	c.startNode(i, lis)
}

func (c *testCluster) close() {
	for i := range c.nodes {
		c.stopNode(i)
	}
}

// leases is a client of node i; nil while the node is stopped.
func (c *testCluster) leases(i int) leasepb.LeasesClient {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.clients[i] == nil {
		return nil
	}
	return leasepb.NewLeasesClient(c.clients[i])
}

// running returns the nodes that are up, by index (nil for stopped ones).
func (c *testCluster) running() []*Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*Server(nil), c.nodes...)
}

// waitLeader polls until exactly one running node leads and every running node agrees; it returns its index.
func (c *testCluster) waitLeader() int {
	c.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		nodes := c.running()
		leader, agreed := -1, true
		for i, s := range nodes {
			if s == nil {
				continue
			}
			if s.IsLeader() {
				leader = i
			}
		}
		if leader >= 0 {
			for _, s := range nodes {
				if s != nil && s.Leader() != nodes[leader].ID() {
					agreed = false
				}
			}
			if agreed {
				return leader
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.t.Fatal("no leader within 10s")
	return -1
}

// follower returns the index of a running node that is not the leader.
func (c *testCluster) follower() int {
	leader := c.waitLeader()
	for i, s := range c.running() {
		if s != nil && i != leader {
			return i
		}
	}
	c.t.Fatal("no follower")
	return -1
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// eventually polls cond until it holds or the timeout passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
