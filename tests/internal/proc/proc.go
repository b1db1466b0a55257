// Package proc runs leased clusters as real processes on 127.0.0.1 for the multi-process tests
// (tests/e2e, tests/chaos). It builds the binary, picks free ports, and starts, signals, kills and restarts
// each node on its own data dir and addresses, which stay the same across restarts; it finds the leader
// through the Cluster service's Status.
//
// Every node runs with fast timing (Tick, ElectionTicks) and GORACE=halt_on_error=1, and appends its
// output to a log file next to its data dir. New registers a t.Cleanup that SIGKILLs whatever still runs
// and closes the client connections, so no process or goroutine outlives the test. Waiting is done by
// polling with a deadline (Poll), never by sleeping.
package proc

import (
	"context"
	"crypto/tls"
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
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server/servertest"
)

// Timing of the test clusters: a 200 ms election timeout (--election-timeout: a 20 ms tick, 10 election
// ticks; raft randomizes it to 200..400 ms), so a TTL floor of 1.6 s. The checkpoint interval is 5 × the election
// timeout, as in production (5 s at 1 s): shorter than a lease's renewal interval, it would make every
// renewal a durable entry (a lease idle since the last checkpoint is renewed through the log), which a
// production cluster never does at the floor.
const (
	Tick            = 20 * time.Millisecond
	ElectionTicks   = 10
	ElectionTimeout = ElectionTicks * Tick
	// CheckpointInterval is the leader's lease checkpoint interval (--checkpoint-interval).
	CheckpointInterval = 5 * ElectionTimeout
)

// statusTimeout bounds one Status call: a node that does not answer by then counts as not answering.
const statusTimeout = 500 * time.Millisecond

// Build builds cmd/leased with the build tags (none if empty) into dir and returns the binary's path.
// `go test` puts its own go first on PATH.
func Build(dir, tags string) (string, error) { return BuildCommand(dir, "leased", tags) }

// BuildCommand builds cmd/<name> (leased or leasectl) with the build tags into dir and returns the path.
func BuildCommand(dir, name, tags string) (string, error) {
	bin := filepath.Join(dir, name+tags)
	args := []string{"build", "-o", bin}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	out, err := exec.Command("go", append(args, "github.com/leased/leased/cmd/"+name)...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("build %s (tags %q): %w\n%s", name, tags, err, out)
	}
	return bin, nil
}

// LatestRelease returns the newest release tag of the revision the tests run at (git describe --tags
// --abbrev=0): the build a rolling upgrade starts from. Compatibility is promised between tagged releases
// only (docs/design.md, "Upgrades"), so without a tag t is skipped, saying so.
func LatestRelease(t testing.TB) string {
	t.Helper()
	NeedGitHistory(t)
	out, err := exec.Command("git", "describe", "--tags", "--abbrev=0").CombinedOutput()
	if err != nil {
		t.Skipf("SKIPPED: no release tag: compatibility is promised between tagged releases only (git describe: %s)",
			strings.TrimSpace(string(out)))
	}
	return strings.TrimSpace(string(out))
}

// NeedGitHistory skips t, loudly, when the tests do not run inside a git repository (a source archive),
// which BuildRevision needs — except under CI=true, where that fails t.
func NeedGitHistory(t testing.TB) {
	t.Helper()
	if err := exec.Command("git", "rev-parse", "--git-dir").Run(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("this test builds an earlier revision and needs the repository's git history: %v", err)
		}
		t.Skipf("SKIPPED: this test builds an earlier revision and needs the repository's git history; this is no git repository (%v)", err)
	}
}

// BuildRevision builds cmd/leased as it was at the git revision rev of the repository the tests run in,
// with the build tags, into dir, and returns the binary's path. The binary reports version (it is set
// with -ldflags), so a test can tell which build a node runs. The source is exported with git archive
// into a directory of its own: the repository's work tree and git state are left alone.
func BuildRevision(dir, rev, tags, version string) (string, error) {
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return "", fmt.Errorf("find the repository to build revision %q in: %w", rev, err)
	}
	if out, err := exec.Command("git", "rev-parse", "--verify", "--quiet", rev+"^{commit}").CombinedOutput(); err != nil {
		return "", fmt.Errorf("revision %q: not a commit of this repository (%v)\n%s", rev, err, out)
	}
	src, err := os.MkdirTemp(dir, "src-")
	if err != nil {
		return "", err
	}
	export := exec.Command("sh", "-c", `git archive --format=tar "$1" | tar -x -C "$2"`, "sh", rev, src)
	export.Dir = strings.TrimSpace(string(top)) // in a subdirectory, git archive exports only that
	if out, err := export.CombinedOutput(); err != nil {
		return "", fmt.Errorf("export revision %q with git archive: %w\n%s", rev, err, out)
	}
	bin := filepath.Join(dir, "leased-"+version)
	if err := buildVersioned(src, bin, tags, version); err != nil {
		return "", fmt.Errorf("build revision %q: %w", rev, err)
	}
	return bin, nil
}

// BuildVersion builds cmd/leased from the tree the tests run in, reporting version, into dir, and returns
// the binary's path: a new version to upgrade a cluster to.
func BuildVersion(dir, version string) (string, error) {
	bin := filepath.Join(dir, "leased-"+version)
	if err := buildVersioned("", bin, "", version); err != nil {
		return "", fmt.Errorf("build version %q: %w", version, err)
	}
	return bin, nil
}

// buildVersioned builds cmd/leased into bin with the build tags, its version set to version, from the
// module in src ("": the one the tests run in).
func buildVersioned(src, bin, tags, version string) error {
	pkg := "github.com/leased/leased/cmd/leased"
	if src != "" {
		pkg = "./cmd/leased" // the revision's own go.mod, whatever encloses it (GOWORK=off below)
	}
	build := exec.Command("go", "build", "-o", bin, "-tags", tags,
		"-ldflags", "-X github.com/leased/leased/cmd/internal/buildinfo.version="+version, pkg)
	if src != "" {
		build.Dir = src
		build.Env = append(os.Environ(), "GOWORK=off")
	}
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("%w\n%s", err, out)
	}
	return nil
}

// FreeAddrs returns n distinct loopback addresses that were free a moment ago (servertest.FreeAddrs).
func FreeAddrs(t testing.TB, n int) []string { return servertest.FreeAddrs(t, n) }

// Poll calls cond every 10 ms until it holds, or returns an error after timeout.
func Poll(timeout time.Duration, cond func() bool) error {
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

// Config describes a cluster.
type Config struct {
	Bin  string // the leased binary
	Dir  string // node <name> keeps its data in Dir/<name> and its log in Dir/<name>.log
	Size int    // nodes n1..n<Size>

	// Admin gives every node an admin HTTP address; without it the admin endpoint is off.
	Admin bool
	// Gossip gives every node a gossip address (--gossip-addr); the founding nodes --join each other.
	Gossip bool
	// PeerHost, if set, is the host node i's peers dial it at (in --initial-cluster), with its peer port;
	// by default they dial its peer address.
	PeerHost func(i int) string
	// Args are flags added to every node's command line.
	Args []string
	// Env, if set, returns variables added to node i's environment.
	Env func(i int) []string
	// NodeArgs, if set, returns flags added to node i's command line (its certificate files, say).
	NodeArgs func(i int) []string
	// ClientTLS, if set, secures the cluster's own client connections (Node.Conn), for nodes that serve
	// TLS on their client ports.
	ClientTLS *tls.Config
}

// Node is one leased process. Its name, addresses and data dir stay the same across restarts.
type Node struct {
	Name, DataDir, LogPath          string
	ClientAddr, PeerAddr, AdminAddr string // AdminAddr is empty without Config.Admin
	GossipAddr                      string // empty without Config.Gossip
	Conn                            *grpc.ClientConn
	// InitialCluster, when set, replaces the cluster's --initial-cluster for this node (a node added
	// later lists the current members); Args are flags added to this node's command line only. Set them
	// before Start.
	// NoInitialCluster leaves --initial-cluster out (a node that finds the cluster through --join).
	InitialCluster   string
	NoInitialCluster bool
	Args             []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd.Wait has returned
}

// Cluster is a set of leased processes. Its methods may be called from any goroutine; those that fail
// call t.Fatal.
type Cluster struct {
	Nodes []*Node

	t         testing.TB
	cfg       Config
	initial   string
	used      map[string]bool // every address handed to a node (freshAddrs)
	closeOnce sync.Once
}

// New prepares cfg.Size nodes on free ports and dials them, but starts none: call Start for each. A
// t.Cleanup registered here calls Close.
func New(t testing.TB, cfg Config) *Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("starts leased processes: skipped under -short (make test-short); make test runs it")
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	c := &Cluster{t: t, cfg: cfg}
	t.Cleanup(c.Close)
	var members []string
	for i := range cfg.Size {
		n := c.newNode(fmt.Sprintf("n%d", i+1))
		peer := n.PeerAddr
		if cfg.PeerHost != nil {
			_, port, _ := net.SplitHostPort(n.PeerAddr)
			peer = net.JoinHostPort(cfg.PeerHost(i), port)
		}
		members = append(members, n.Name+"="+peer)
		c.Nodes = append(c.Nodes, n)
	}
	c.initial = strings.Join(members, ",")
	if cfg.Gossip {
		for _, n := range c.Nodes {
			var others []string
			for _, o := range c.Nodes {
				if o != n {
					others = append(others, o.GossipAddr)
				}
			}
			n.Args = append(n.Args, "--join="+strings.Join(others, ","))
		}
	}
	return c
}

// SetBinary makes later Starts run bin (a rolling upgrade); nodes already running are left alone. Call
// it from the goroutine that calls Start.
func (c *Cluster) SetBinary(bin string) { c.cfg.Bin = bin }

// freshAddrs returns n free addresses that no node of the cluster has been given (FreeAddrs alone only
// keeps one call's addresses distinct).
func (c *Cluster) freshAddrs(n int) []string {
	if c.used == nil {
		c.used = map[string]bool{}
	}
	var out []string
	for len(out) < n {
		for _, a := range FreeAddrs(c.t, n-len(out)) {
			if !c.used[a] && !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
	}
	for _, a := range out {
		c.used[a] = true
	}
	return out
}

// newNode allocates a node's ports, data dir and client connection.
func (c *Cluster) newNode(name string) *Node {
	c.t.Helper()
	per := 2
	if c.cfg.Admin {
		per++
	}
	if c.cfg.Gossip {
		per++
	}
	addrs := c.freshAddrs(per)
	n := &Node{Name: name, ClientAddr: addrs[0], PeerAddr: addrs[1], DataDir: filepath.Join(c.cfg.Dir, name),
		LogPath: filepath.Join(c.cfg.Dir, name+".log")}
	next := 2
	if c.cfg.Admin {
		n.AdminAddr, next = addrs[next], next+1
	}
	if c.cfg.Gossip {
		n.GossipAddr = addrs[next]
	}
	conn, err := dial(n.ClientAddr, c.cfg.ClientTLS)
	if err != nil {
		c.t.Fatal(err)
	}
	n.Conn = conn
	return n
}

// AddNode prepares one more node called name on fresh ports (not started) and returns its index. To
// join the running cluster it needs `leasectl member add` (or MemberAdd) first, and InitialCluster and
// Args such as --initial-cluster-state=existing. It appends to Nodes: call it only from the goroutine
// that drives the cluster, while no other goroutine reads Nodes.
func (c *Cluster) AddNode(name string) int {
	c.t.Helper()
	n := c.newNode(name)
	c.Nodes = append(c.Nodes, n)
	return len(c.Nodes) - 1
}

// dial connects to a node's client address, with a short reconnect backoff.
func dial(addr string, clientTLS *tls.Config) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if clientTLS != nil {
		creds = credentials.NewTLS(clientTLS)
	}
	return grpc.NewClient(addr,
		grpc.WithTransportCredentials(creds),
		// A restarted node must be found again quickly, not after grpc's default backoff of up to 2 min.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, MaxDelay: 300 * time.Millisecond},
			MinConnectTimeout: time.Second,
		}))
}

// InitialCluster is the founding members' --initial-cluster value.
func (c *Cluster) InitialCluster() string { return c.initial }

// Endpoints returns the nodes' client addresses.
func (c *Cluster) Endpoints() []string {
	var eps []string
	for _, n := range c.Nodes {
		eps = append(eps, n.ClientAddr)
	}
	return eps
}

// Start starts node i (again, after Kill or Stop) on its data dir and addresses. It fails the test if i
// still runs.
func (c *Cluster) Start(i int) {
	c.t.Helper()
	n := c.Nodes[i]
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		select {
		case <-n.exited:
		default:
			c.t.Fatalf("%s is still running", n.Name)
		}
	}
	logf, err := os.OpenFile(n.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	defer logf.Close()
	fmt.Fprintf(logf, "=== start %s at %s\n", n.Name, time.Now().Format(time.RFC3339Nano))
	initial := c.initial
	if n.InitialCluster != "" {
		initial = n.InitialCluster
	}
	args := []string{
		"--name=" + n.Name, "--data-dir=" + n.DataDir,
		"--client-addr=" + n.ClientAddr, "--peer-addr=" + n.PeerAddr, "--admin-addr=" + n.AdminAddr,
	}
	if !n.NoInitialCluster {
		args = append(args, "--initial-cluster="+initial)
	}
	args = append(append(args,
		"--election-timeout="+ElectionTimeout.String(),
		"--proposal-timeout=2s", "--checkpoint-interval="+CheckpointInterval.String(), "--log-level=info"),
		c.nodeArgs(i)...)
	if n.GossipAddr != "" {
		args = append(args, "--gossip-addr="+n.GossipAddr)
	}
	cmd := exec.Command(c.cfg.Bin, append(args, n.Args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf // files: no copying goroutines
	cmd.Env = append(os.Environ(), "GORACE=halt_on_error=1")
	if c.cfg.Env != nil {
		cmd.Env = append(cmd.Env, c.cfg.Env(i)...)
	}
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("start %s: %v", n.Name, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	n.cmd, n.exited = cmd, exited
}

// nodeArgs are the flags Config adds to node i's command line.
func (c *Cluster) nodeArgs(i int) []string {
	args := slices.Clone(c.cfg.Args)
	if c.cfg.NodeArgs != nil {
		args = append(args, c.cfg.NodeArgs(i)...)
	}
	return args
}

// Running reports whether node i runs (a SIGSTOPped node runs).
func (c *Cluster) Running(i int) bool {
	n := c.Nodes[i]
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

// Exited reports whether node i's latest process has exited, and its exit code if so (-1: a signal).
func (c *Cluster) Exited(i int) (code int, exited bool) {
	cmd, done := c.Nodes[i].current()
	if cmd == nil {
		return 0, false
	}
	select {
	case <-done:
		return cmd.ProcessState.ExitCode(), true
	default:
		return 0, false
	}
}

// current returns node i's latest process and the channel closed when it has exited (nil, nil if it was
// never started).
func (n *Node) current() (*exec.Cmd, <-chan struct{}) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cmd, n.exited
}

// Signal sends sig to node i without waiting for anything (SIGSTOP pauses it, SIGCONT resumes it).
func (c *Cluster) Signal(i int, sig syscall.Signal) {
	if cmd, _ := c.Nodes[i].current(); cmd != nil {
		_ = cmd.Process.Signal(sig)
	}
}

// Stop sends sig to node i and waits up to timeout for it to exit, and returns its exit code (-1 when a
// signal ended it). It fails the test if i was never started or did not exit in time (it is SIGKILLed).
func (c *Cluster) Stop(i int, sig syscall.Signal, timeout time.Duration) int {
	c.t.Helper()
	n := c.Nodes[i]
	cmd, exited := n.current()
	if cmd == nil {
		c.t.Fatalf("%s was never started", n.Name)
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-exited:
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-exited
		c.t.Fatalf("%s did not exit within %v of %v", n.Name, timeout, sig)
	}
	return cmd.ProcessState.ExitCode()
}

// Kill SIGKILLs node i (paused or not) and waits for it to be gone. A node never started is left alone.
func (c *Cluster) Kill(i int) {
	if cmd, exited := c.Nodes[i].current(); cmd != nil {
		_ = cmd.Process.Kill()
		<-exited
	}
}

// Close kills every node and closes the client connections. It is idempotent; New's t.Cleanup calls it.
func (c *Cluster) Close() {
	c.closeOnce.Do(func() {
		for i, n := range c.Nodes {
			c.Kill(i)
			_ = n.Conn.Close()
		}
	})
}

// Leases returns a Leases client of node i.
func (c *Cluster) Leases(i int) leasepb.LeasesClient { return leasepb.NewLeasesClient(c.Nodes[i].Conn) }

// Status asks node i about itself, briefly (500 ms at most).
func (c *Cluster) Status(ctx context.Context, i int) (*leasepb.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	return leasepb.NewClusterClient(c.Nodes[i].Conn).Status(ctx, &leasepb.StatusRequest{})
}

// Leader asks every running node but those in exclude for its status, and returns the one that reports
// itself leader with the highest term, and that status; -1 and nil if none does.
func (c *Cluster) Leader(ctx context.Context, exclude ...int) (int, *leasepb.StatusResponse) {
	best, st := -1, (*leasepb.StatusResponse)(nil)
	for i := range c.Nodes {
		if slices.Contains(exclude, i) || !c.Running(i) {
			continue
		}
		if s, err := c.Status(ctx, i); err == nil && s.GetRole() == leasepb.Role_ROLE_LEADER && s.GetTerm() >= st.GetTerm() {
			best, st = i, s
		}
	}
	return best, st
}

// WaitLeader polls Leader until there is one, for at most timeout.
func (c *Cluster) WaitLeader(timeout time.Duration, exclude ...int) (int, *leasepb.StatusResponse, error) {
	var (
		idx int
		st  *leasepb.StatusResponse
	)
	err := Poll(timeout, func() bool {
		idx, st = c.Leader(context.Background(), exclude...)
		return idx >= 0
	})
	if err != nil {
		return -1, nil, fmt.Errorf("no leader: %w", err)
	}
	return idx, st, nil
}
