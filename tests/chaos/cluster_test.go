package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/leasepb"
)

// Timing of the chaos clusters: 20 ms ticks, an election timeout of 10 ticks (200..400 ms randomised).
const (
	tick            = 20 * time.Millisecond
	electionTicks   = 10
	electionTimeout = electionTicks * tick
)

// node is one leased process. Its addresses and data dir stay the same across restarts.
type node struct {
	name, dataDir, logPath string
	clientAddr, peerAddr   string

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	stopped bool // SIGSTOPped
}

// cluster is three leased processes on 127.0.0.1 whose peer links all pass through a faultProxy.
type cluster struct {
	t       testing.TB
	bin     string
	nodes   []*node
	initial string
	proxy   *faultProxy
	conns   []*grpc.ClientConn
}

func newCluster(t testing.TB, bin, dir string, size int) *cluster {
	t.Helper()
	addrs := freeAddrs(t, 2*size)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, bin: bin}
	var members, peers []string
	for i := range size {
		n := &node{
			name: fmt.Sprintf("n%d", i+1), clientAddr: addrs[2*i], peerAddr: addrs[2*i+1],
		}
		n.dataDir = filepath.Join(dir, n.name)
		n.logPath = filepath.Join(dir, n.name+".log")
		_, port, _ := net.SplitHostPort(n.peerAddr)
		members = append(members, n.name+"="+peerHost(i)+":"+port)
		peers = append(peers, n.peerAddr)
		c.nodes = append(c.nodes, n)
		conn, err := grpc.NewClient(n.clientAddr,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithConnectParams(grpc.ConnectParams{
				Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, MaxDelay: 300 * time.Millisecond},
				MinConnectTimeout: time.Second,
			}))
		if err != nil {
			t.Fatal(err)
		}
		c.conns = append(c.conns, conn)
	}
	c.initial = strings.Join(members, ",")
	p, err := newFaultProxy(peers)
	if err != nil {
		t.Fatal(err)
	}
	c.proxy = p
	t.Cleanup(c.cleanup)
	for i := range c.nodes {
		c.start(i)
	}
	if _, err := c.waitLeader(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	return c
}

func freeAddrs(t testing.TB, n int) []string {
	t.Helper()
	var addrs []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		addrs = append(addrs, l.Addr().String())
	}
	return addrs
}

func (c *cluster) endpoints() []string {
	var eps []string
	for _, n := range c.nodes {
		eps = append(eps, n.clientAddr)
	}
	return eps
}

// start (re)starts node i on its data dir.
func (c *cluster) start(i int) {
	n := c.nodes[i]
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		select {
		case <-n.exited:
		default:
			return // still running
		}
	}
	logf, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	defer logf.Close()
	fmt.Fprintf(logf, "=== start %s at %s\n", n.name, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(c.bin,
		"--name="+n.name, "--data-dir="+n.dataDir,
		"--client-addr="+n.clientAddr, "--peer-addr="+n.peerAddr, "--admin-addr=",
		"--initial-cluster="+c.initial,
		fmt.Sprintf("--tick=%v", tick), fmt.Sprintf("--election-ticks=%d", electionTicks), "--heartbeat-ticks=1",
		"--proposal-timeout=2s", "--checkpoint-interval=500ms",
		"--snapshot-entries=5000", "--snapshot-catchup=1000", "--log-level=info")
	cmd.Stdout, cmd.Stderr = logf, logf
	proxy := c.proxy.url(i)
	cmd.Env = append(os.Environ(),
		"HTTPS_PROXY="+proxy, "https_proxy="+proxy, "HTTP_PROXY=", "http_proxy=", "NO_PROXY=", "no_proxy=",
		"GORACE=halt_on_error=1")
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("start %s: %v", n.name, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	n.cmd, n.exited, n.stopped = cmd, exited, false
}

func (c *cluster) running(i int) bool {
	n := c.nodes[i]
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return false
	}
	select {
	case <-n.exited:
		return false
	default:
		return true
	}
}

// kill SIGKILLs node i and waits for it to be gone.
func (c *cluster) kill(i int) {
	n := c.nodes[i]
	n.mu.Lock()
	cmd, exited := n.cmd, n.exited
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

// pause SIGSTOPs node i; resume SIGCONTs it.
func (c *cluster) pause(i int)  { c.signalStop(i, syscall.SIGSTOP, true) }
func (c *cluster) resume(i int) { c.signalStop(i, syscall.SIGCONT, false) }

func (c *cluster) signalStop(i int, sig syscall.Signal, stopped bool) {
	n := c.nodes[i]
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		_ = n.cmd.Process.Signal(sig)
		n.stopped = stopped
	}
}

// healAll resumes paused nodes, restarts dead ones and heals every link.
func (c *cluster) healAll() {
	c.proxy.heal()
	for i := range c.nodes {
		c.resume(i)
		if !c.running(i) {
			c.start(i)
		}
	}
}

func (c *cluster) cleanup() {
	for i := range c.nodes {
		c.resume(i)
		c.kill(i)
	}
	for _, conn := range c.conns {
		_ = conn.Close()
	}
	c.proxy.close()
}

func (c *cluster) leases(i int) leasepb.LeasesClient   { return leasepb.NewLeasesClient(c.conns[i]) }
func (c *cluster) cluster(i int) leasepb.ClusterClient { return leasepb.NewClusterClient(c.conns[i]) }

func (c *cluster) status(ctx context.Context, i int) (*leasepb.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	return c.cluster(i).Status(ctx, &leasepb.StatusRequest{})
}

// leader returns the index of a node that reports itself leader (the one with the highest term), or -1.
func (c *cluster) leader(ctx context.Context) int {
	best, term := -1, uint64(0)
	for i := range c.nodes {
		if s, err := c.status(ctx, i); err == nil && s.GetRole() == leasepb.Role_ROLE_LEADER && s.GetTerm() >= term {
			best, term = i, s.GetTerm()
		}
	}
	return best
}

// waitLeader polls until a node reports itself leader.
func (c *cluster) waitLeader(timeout time.Duration) (int, error) {
	var idx int
	err := poll(timeout, func() bool {
		idx = c.leader(context.Background())
		return idx >= 0
	})
	if err != nil {
		return -1, fmt.Errorf("no leader: %w", err)
	}
	return idx, nil
}

// poll calls cond every 10 ms until it holds, or returns an error after timeout.
func poll(timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	tk := time.NewTicker(10 * time.Millisecond)
	defer tk.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %v", timeout)
		}
		<-tk.C
	}
	return nil
}

// nodeState is one node's applied lease state, read locally (serializable), at a known applied index.
type nodeState struct {
	applied uint64
	leases  []*leasepb.Lease // remaining_ms cleared (only the leader knows it)
}

func (c *cluster) localState(ctx context.Context, i int) (nodeState, error) {
	var st nodeState
	before, err := c.status(ctx, i)
	if err != nil {
		return st, err
	}
	page := ""
	for range 10000 {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := c.leases(i).List(cctx, &leasepb.ListRequest{Limit: 1000, PageToken: page, Serializable: true})
		cancel()
		if err != nil {
			return st, err
		}
		for _, l := range resp.GetLeases() {
			l = proto.Clone(l).(*leasepb.Lease)
			l.RemainingMs = 0
			st.leases = append(st.leases, l)
		}
		if page = resp.GetNextPageToken(); page == "" {
			break
		}
	}
	after, err := c.status(ctx, i)
	if err != nil {
		return st, err
	}
	if before.GetAppliedIndex() != after.GetAppliedIndex() {
		return st, errMoved
	}
	st.applied = after.GetAppliedIndex()
	return st, nil
}

var errMoved = errors.New("applied index moved during the read")

// sameStates waits until every node reports the same applied index and reads each node's state there.
func (c *cluster) sameStates(timeout time.Duration) ([]nodeState, error) {
	var states []nodeState
	var last error
	err := poll(timeout, func() bool {
		states = states[:0]
		for i := range c.nodes {
			st, err := c.localState(context.Background(), i)
			if err != nil {
				last = err
				return false
			}
			states = append(states, st)
		}
		for _, st := range states[1:] {
			if st.applied != states[0].applied {
				last = fmt.Errorf("applied indexes differ")
				return false
			}
		}
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("%w (last: %v)", err, last)
	}
	return slices.Clone(states), nil
}
