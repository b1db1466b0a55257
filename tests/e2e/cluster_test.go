package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/leased/leased/api/leasepb"
)

// Timing of the test clusters: a 20 ms tick and 10 election ticks give a 200 ms election timeout (raft
// randomizes it to 200..400 ms).
const (
	tick            = 20 * time.Millisecond
	electionTicks   = 10
	electionTimeout = electionTicks * tick
)

// proc is one leased process of a cluster. Its addresses and data dir stay the same across restarts.
type proc struct {
	name                           string
	dataDir, logPath               string
	clientAddr, peerAddr, adminAdr string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd.Wait has returned
}

// cluster is a set of leased processes on 127.0.0.1, started from the binary TestMain built.
type cluster struct {
	t       *testing.T
	procs   []*proc
	initial string
	extra   []string
	conns   []*grpc.ClientConn
	http    *http.Client
}

// newCluster starts size processes named n1..n<size> on free ports with their own data dirs, and waits
// for a leader. t.Cleanup SIGKILLs whatever still runs, even if the test fails.
func newCluster(t *testing.T, size int, extra ...string) *cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end test: skipped with -short")
	}
	c := &cluster{t: t, extra: extra, http: &http.Client{
		Timeout:   time.Second,
		Transport: &http.Transport{DisableKeepAlives: true},
	}}
	dir := t.TempDir()
	addrs := freeAddrs(t, 3*size)
	var members []string
	for i := range size {
		p := &proc{
			name:       fmt.Sprintf("n%d", i+1),
			clientAddr: addrs[3*i], peerAddr: addrs[3*i+1], adminAdr: addrs[3*i+2],
		}
		p.dataDir = filepath.Join(dir, p.name)
		p.logPath = filepath.Join(dir, p.name+".log")
		members = append(members, p.name+"="+p.peerAddr)
		c.procs = append(c.procs, p)
		conn, err := grpc.NewClient(p.clientAddr,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			// A restarted node must be found again quickly, not after grpc's default backoff of up to 2 min.
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
	t.Cleanup(c.cleanup)
	for i := range c.procs {
		c.start(i)
	}
	c.waitLeader(10*time.Second, -1)
	return c
}

// freeAddrs returns n distinct loopback addresses that were free a moment ago (listen on :0, then close).
func freeAddrs(t *testing.T, n int) []string {
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

func (c *cluster) args(p *proc) []string {
	return append([]string{
		"--name=" + p.name, "--data-dir=" + p.dataDir,
		"--client-addr=" + p.clientAddr, "--peer-addr=" + p.peerAddr, "--admin-addr=" + p.adminAdr,
		"--initial-cluster=" + c.initial,
		fmt.Sprintf("--tick=%v", tick), fmt.Sprintf("--election-ticks=%d", electionTicks), "--heartbeat-ticks=1",
		"--proposal-timeout=2s", "--checkpoint-interval=500ms", "--log-level=info",
	}, c.extra...)
}

// start starts process i (again, after a kill or stop) on its data dir and addresses.
func (c *cluster) start(i int) {
	c.t.Helper()
	p := c.procs[i]
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		select {
		case <-p.exited:
		default:
			c.t.Fatalf("%s is still running", p.name)
		}
	}
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	defer logf.Close()
	fmt.Fprintf(logf, "=== start %s at %s\n", p.name, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(leasedBin, c.args(p)...)
	cmd.Stdout, cmd.Stderr = logf, logf // files: no copying goroutines
	cmd.Env = append(os.Environ(), "GORACE=halt_on_error=1")
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("start %s: %v", p.name, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	p.cmd, p.exited = cmd, exited
}

// running reports whether process i runs.
func (c *cluster) running(i int) bool {
	p := c.procs[i]
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// signal sends sig to process i and waits (up to timeout) for it to exit; it returns the exit code (-1
// when a signal ended it).
func (c *cluster) signal(i int, sig syscall.Signal, timeout time.Duration) int {
	c.t.Helper()
	p := c.procs[i]
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		c.t.Fatalf("%s was never started", p.name)
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-exited:
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-exited
		c.t.Fatalf("%s did not exit within %v of %v", p.name, timeout, sig)
	}
	return cmd.ProcessState.ExitCode()
}

// kill SIGKILLs process i and waits for it to be gone.
func (c *cluster) kill(i int) { c.signal(i, syscall.SIGKILL, 10*time.Second) }

// stop SIGTERMs process i (a clean shutdown) and returns its exit code.
func (c *cluster) stop(i int) int { return c.signal(i, syscall.SIGTERM, 15*time.Second) }

func (c *cluster) cleanup() {
	for i, p := range c.procs {
		if c.running(i) {
			p.mu.Lock()
			cmd, exited := p.cmd, p.exited
			p.mu.Unlock()
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	for _, conn := range c.conns {
		_ = conn.Close()
	}
	if c.t.Failed() {
		for _, p := range c.procs {
			c.t.Logf("--- last lines of %s's log:\n%s", p.name, tail(p.logPath, 40))
		}
	}
}

func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

func (c *cluster) leases(i int) leasepb.LeasesClient   { return leasepb.NewLeasesClient(c.conns[i]) }
func (c *cluster) cluster(i int) leasepb.ClusterClient { return leasepb.NewClusterClient(c.conns[i]) }

// status asks process i about itself, briefly.
func (c *cluster) status(i int) (*leasepb.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	return c.cluster(i).Status(ctx, &leasepb.StatusRequest{})
}

// waitLeader polls Status until a running process other than exclude reports itself leader, and returns its
// index and status.
func (c *cluster) waitLeader(timeout time.Duration, exclude int) (int, *leasepb.StatusResponse) {
	c.t.Helper()
	var idx int
	var st *leasepb.StatusResponse
	c.eventually(timeout, "a leader", func() bool {
		for i := range c.procs {
			if i == exclude || !c.running(i) {
				continue
			}
			if s, err := c.status(i); err == nil && s.GetRole() == leasepb.Role_ROLE_LEADER {
				idx, st = i, s
				return true
			}
		}
		return false
	})
	return idx, st
}

// readyz returns the HTTP status of process i's /readyz (0 when it does not answer).
func (c *cluster) readyz(i int) int {
	resp, err := c.http.Get("http://" + c.procs[i].adminAdr + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// eventually polls cond every 10 ms until it holds, or fails the test after timeout.
func (c *cluster) eventually(timeout time.Duration, what string, cond func() bool) {
	c.t.Helper()
	if err := poll(timeout, cond); err != nil {
		c.t.Fatalf("waiting for %s: %v", what, err)
	}
}

func poll(timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %v", timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

var errGaveUp = errors.New("gave up retrying")
