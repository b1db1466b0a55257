package e2e

import (
	"bufio"
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/tests/internal/proc"
)

// cluster is a set of leased processes on 127.0.0.1 (see package proc), started from the binary TestMain
// built, each with an admin HTTP address.
type cluster struct {
	*proc.Cluster
	t    *testing.T
	http *http.Client
}

// newCluster starts size processes named n1..n<size> on free ports with their own data dirs, and waits
// for a leader. t.Cleanup SIGKILLs whatever still runs, even if the test fails, and then logs the end of
// every node's log if it did.
func newCluster(t *testing.T, size int, extra ...string) *cluster {
	t.Helper()
	return newClusterWith(t, proc.Config{Size: size, Args: extra})
}

// newClusterWith is newCluster with more of proc.Config (Bin, Dir and Admin are set here).
func newClusterWith(t *testing.T, cfg proc.Config) *cluster {
	t.Helper()
	c := prepareClusterWith(t, cfg)
	for i := range c.Nodes {
		c.Start(i)
	}
	c.waitLeader(10*time.Second, -1)
	return c
}

// prepareCluster is newCluster without starting anything: the nodes' addresses and data dirs are chosen.
func prepareCluster(t *testing.T, size int, extra ...string) *cluster {
	t.Helper()
	return prepareClusterWith(t, proc.Config{Size: size, Args: extra})
}

func prepareClusterWith(t *testing.T, cfg proc.Config) *cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end test: skipped with -short")
	}
	c := &cluster{t: t, http: &http.Client{
		Timeout:   time.Second,
		Transport: &http.Transport{DisableKeepAlives: true},
	}}
	dir := t.TempDir()
	t.Cleanup(func() { // registered before the cluster's, so it runs after the processes are gone
		if t.Failed() && c.Cluster != nil {
			for _, n := range c.Nodes {
				t.Logf("--- last lines of %s's log:\n%s", n.Name, tail(n.LogPath, 40))
			}
		}
	})
	cfg.Bin, cfg.Dir, cfg.Admin = leasedBin, dir, true
	c.Cluster = proc.New(t, cfg)
	return c
}

// stop SIGTERMs process i (a clean shutdown) and returns its exit code.
func (c *cluster) stop(i int) int { return c.Stop(i, syscall.SIGTERM, 15*time.Second) }

// status asks process i about itself, briefly.
func (c *cluster) status(i int) (*leasepb.StatusResponse, error) {
	return c.Status(context.Background(), i)
}

// waitLeader polls Status until a running process other than exclude reports itself leader, and returns its
// index and status.
func (c *cluster) waitLeader(timeout time.Duration, exclude int) (int, *leasepb.StatusResponse) {
	c.t.Helper()
	idx, st, err := c.WaitLeader(timeout, exclude)
	if err != nil {
		c.t.Fatalf("waiting for a leader: %v", err)
	}
	return idx, st
}

// readyz returns the HTTP status of process i's /readyz (0 when it does not answer).
func (c *cluster) readyz(i int) int {
	resp, err := c.http.Get("http://" + c.Nodes[i].AdminAddr + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// eventually polls cond every 10 ms until it holds, or fails the test after timeout.
func (c *cluster) eventually(timeout time.Duration, what string, cond func() bool) {
	c.t.Helper()
	if err := proc.Poll(timeout, cond); err != nil {
		c.t.Fatalf("waiting for %s: %v", what, err)
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

var errGaveUp = errors.New("gave up retrying")

// metric is the value of the unlabelled series name on process i's /metrics (0 when it is missing or
// the node does not answer).
func (c *cluster) metric(i int, name string) float64 {
	resp, err := c.http.Get("http://" + c.Nodes[i].AdminAddr + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}

// runLeased runs leased with args, its output to logPath, until the test ends; the channel is closed
// when it exits.
func runLeased(t *testing.T, logPath string, args []string) <-chan struct{} {
	t.Helper()
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(leasedBin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	return exited
}
