// Package servertest starts in-process leased clusters on loopback for the tests of other packages (the
// client SDK, leasectl, end-to-end checks). Every node is a real server.Server with its own data dir and
// real gRPC listeners on 127.0.0.1, and serves the HTTP/JSON API too (HTTPAddrs); the cluster is closed by
// t.Cleanup.
package servertest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest/testcerts"
)

// Cluster is a running in-process cluster.
type Cluster struct {
	t    testing.TB
	cfgs []server.Config
	// creds secure the cluster's own connections (Conn); insecure unless StartTLS or StartWithACL.
	creds credentials.TransportCredentials

	mu    sync.Mutex
	nodes []*server.Server
	conns []*grpc.ClientConn
}

// Start starts size nodes with server.TestConfig (changed by mutate, if given) and waits for a leader.
// mutate is called once per node, with its Name set, so it can give each node its own Registerer (a
// prometheus.Registry per node, to gather each node's metrics apart). A Registerer serves one server:
// before Restart of such a node, give it a fresh one with SetRegisterer.
func Start(t testing.TB, size int, mutate func(*server.Config)) *Cluster {
	t.Helper()
	return start(t, size, insecure.NewCredentials(), mutate)
}

// StartTLS is Start with TLS on both ports: every node gets a certificate from ca naming it (n1, n2, ...)
// for mutual TLS between peers, and its client port requires client certificates signed by ca
// (ClientCertAuth), and the ACL lets every identity do everything (AllowEveryone). Conn connects as the
// identity "servertest"; ClientTLS makes configurations for others.
// mutate runs after the TLS fields are set, so it can change them.
func StartTLS(t testing.TB, size int, ca *testcerts.CA, mutate func(*server.Config)) *Cluster {
	t.Helper()
	return start(t, size, credentials.NewTLS(testcerts.ClientConfig(ca.Client(t, "servertest"), ca.Pool())), func(cfg *server.Config) {
		node := ca.Node(t, cfg.Name)
		cfg.PeerTLS = testcerts.MutualConfig(node, ca)
		cfg.ClientTLS = testcerts.ServerConfig(node, ca.Pool())
		cfg.ClientCertAuth = true
		cfg.InitialACL = AllowEveryone // with client certificates and no rules, everything is refused
		if mutate != nil {
			mutate(cfg)
		}
	})
}

func start(t testing.TB, size int, creds credentials.TransportCredentials, mutate func(*server.Config)) *Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a cluster: skipped under -short (make test-short); make test runs it")
	}
	c := &Cluster{t: t, creds: creds, nodes: make([]*server.Server, size), conns: make([]*grpc.ClientConn, size)}
	initial := map[string]string{}
	lis := make([]server.Listeners, size)
	for i := range size {
		lis[i] = server.Listeners{Client: listen(t, "127.0.0.1:0"), Peer: listen(t, "127.0.0.1:0"), HTTP: listen(t, "127.0.0.1:0")}
		initial[fmt.Sprintf("n%d", i+1)] = lis[i].Peer.Addr().String()
	}
	dir := t.TempDir()
	for i := range size {
		cfg := server.TestConfig()
		cfg.Name = fmt.Sprintf("n%d", i+1)
		cfg.DataDir = filepath.Join(dir, cfg.Name)
		cfg.ClientAddr, cfg.PeerAddr = lis[i].Client.Addr().String(), lis[i].Peer.Addr().String()
		cfg.HTTPAddr = lis[i].HTTP.Addr().String()
		cfg.InitialCluster = initial
		if mutate != nil {
			mutate(&cfg)
		}
		c.cfgs = append(c.cfgs, cfg)
	}
	for i := range size {
		c.start(i, lis[i])
	}
	t.Cleanup(c.Close)
	c.WaitSettled()
	return c
}

// listenHTTP rebinds a node's HTTP address; nil when a mutate turned it off.
func listenHTTP(addr string) (net.Listener, error) {
	if addr == "" {
		return nil, nil
	}
	return net.Listen("tcp", addr)
}

func listen(t testing.TB, addr string) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func (c *Cluster) start(i int, lis server.Listeners) {
	c.t.Helper()
	s, err := server.New(c.cfgs[i], lis)
	if err != nil {
		c.t.Fatalf("start %s: %v", c.cfgs[i].Name, err)
	}
	s.Start()
	c.mu.Lock()
	c.nodes[i] = s
	c.mu.Unlock()
}

// Endpoints are the client addresses of every node, running or not.
func (c *Cluster) Endpoints() []string {
	out := make([]string, len(c.cfgs))
	for i, cfg := range c.cfgs {
		out[i] = cfg.ClientAddr
	}
	return out
}

// HTTPAddrs are the HTTP/JSON API addresses (Config.HTTPAddr) of every node, running or not.
func (c *Cluster) HTTPAddrs() []string {
	out := make([]string, len(c.cfgs))
	for i, cfg := range c.cfgs {
		out[i] = cfg.HTTPAddr
	}
	return out
}

// Node returns node i, or nil while it is stopped.
func (c *Cluster) Node(i int) *server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i]
}

// Size is the number of nodes, running or not.
func (c *Cluster) Size() int { return len(c.cfgs) }

// Config is node i's configuration.
func (c *Cluster) Config(i int) server.Config { return c.cfgs[i] }

// Conn is a gRPC connection to node i, or nil while it is stopped. Stop closes it.
func (c *Cluster) Conn(i int) *grpc.ClientConn {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.nodes[i] == nil {
		return nil
	}
	if c.conns[i] == nil {
		conn, err := grpc.NewClient(c.cfgs[i].ClientAddr, grpc.WithTransportCredentials(c.creds))
		if err != nil {
			c.t.Fatal(err)
		}
		c.conns[i] = conn
	}
	return c.conns[i]
}

// Leases is a Leases client of node i, or nil while it is stopped.
func (c *Cluster) Leases(i int) leasepb.LeasesClient {
	conn := c.Conn(i)
	if conn == nil {
		return nil
	}
	return leasepb.NewLeasesClient(conn)
}

// Stop closes node i cleanly.
func (c *Cluster) Stop(i int) {
	c.t.Helper()
	c.mu.Lock()
	s, conn := c.nodes[i], c.conns[i]
	c.nodes[i], c.conns[i] = nil, nil
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

// SetRegisterer replaces the Registerer node i gets when it is restarted.
func (c *Cluster) SetRegisterer(i int, reg prometheus.Registerer) { c.cfgs[i].Registerer = reg }

// Restart starts node i again on its data dir and addresses.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		cl, err1 := net.Listen("tcp", c.cfgs[i].ClientAddr)
		pl, err2 := net.Listen("tcp", c.cfgs[i].PeerAddr)
		hl, err3 := listenHTTP(c.cfgs[i].HTTPAddr)
		if err1 == nil && err2 == nil && err3 == nil {
			c.start(i, server.Listeners{Client: cl, Peer: pl, HTTP: hl})
			return
		}
		err2 = errors.Join(err2, err3)
		for _, l := range []net.Listener{cl, pl, hl} {
			if l != nil {
				_ = l.Close()
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("rebind %s: %v %v", c.cfgs[i].Name, err1, err2)
		}
		time.Sleep(20 * time.Millisecond) // the port is still being released; retry binding
	}
}

// Close stops every node.
func (c *Cluster) Close() {
	for i := range c.nodes {
		c.Stop(i)
	}
}

// WaitSettled waits for a leader that has committed and applied an entry of its own term (a linearizable
// read needs that), and for every running node to have applied what the leader applied.
func (c *Cluster) WaitSettled() {
	c.t.Helper()
	li := c.WaitLeader()
	leader := c.Node(li)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		_, err := c.Leases(li).Get(ctx, &leasepb.GetRequest{Resource: "servertest/settle"})
		if status.Code(err) == codes.NotFound || err == nil {
			break
		}
		if ctx.Err() != nil {
			c.t.Fatalf("the leader never served a linearizable read: %v", err)
		}
		time.Sleep(10 * time.Millisecond) // poll: the leader is still committing its first entry
	}
	// Every member announces its client address into the member table after it starts (a conf change):
	// wait for those entries, so that tests measuring the log see it quiet.
	for !c.announced(ctx, li) {
		if ctx.Err() != nil {
			c.t.Fatal("the members did not announce their client addresses within 10s")
		}
		time.Sleep(10 * time.Millisecond) // poll: the announcements are still being applied
	}
	deadline := time.Now().Add(10 * time.Second)
	for !c.caughtUp(leader.AppliedIndex()) {
		if time.Now().After(deadline) {
			c.t.Fatal("nodes did not catch up with the leader within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// announced reports whether node i's member table has a client address for every running node.
func (c *Cluster) announced(ctx context.Context, i int) bool {
	conn := c.Conn(i)
	if conn == nil {
		return false
	}
	resp, err := leasepb.NewClusterClient(conn).MemberList(ctx, &leasepb.MemberListRequest{Serializable: true})
	if err != nil {
		return false
	}
	have := map[string]bool{}
	for _, m := range resp.GetMembers() {
		have[m.GetName()] = m.GetClientAddr() != ""
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for j, s := range c.nodes {
		if s != nil && !have[c.cfgs[j].Name] {
			return false
		}
	}
	return true
}

func (c *Cluster) caughtUp(want uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.nodes {
		if s != nil && s.AppliedIndex() < want {
			return false
		}
	}
	return want > 0
}

// Follower returns the index of a running node that is not the leader.
func (c *Cluster) Follower() int {
	c.t.Helper()
	leader := c.WaitLeader()
	for i := range c.nodes {
		if i != leader && c.Node(i) != nil {
			return i
		}
	}
	c.t.Fatal("no running follower")
	return -1
}

// WaitLeader polls until one running node leads and all running nodes agree; it returns its index.
func (c *Cluster) WaitLeader() int {
	c.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if i := c.leader(); i >= 0 {
			return i
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.t.Fatal("no leader within 10s")
	return -1
}

func (c *Cluster) leader() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	leader := -1
	for i, s := range c.nodes {
		if s != nil && s.IsLeader() {
			leader = i
		}
	}
	if leader < 0 {
		return -1
	}
	for _, s := range c.nodes {
		if s != nil && s.Leader() != c.nodes[leader].ID() {
			return -1
		}
	}
	return leader
}

// AllowEveryone is an ACL that gives every identity every permission on every resource.
var AllowEveryone = []*leasepb.AclRule{{Identity: "*", Prefix: "", Permissions: []leasepb.Permission{
	leasepb.Permission_PERMISSION_READ, leasepb.Permission_PERMISSION_LEASE, leasepb.Permission_PERMISSION_ADMIN}}}
