package chaos

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/tests/internal/proc"
)

// cluster is three leased processes on 127.0.0.1 (see package proc) whose peer links all pass through a
// faultProxy: every node reaches its peers by name (peerHost) through HTTPS_PROXY.
type cluster struct {
	*proc.Cluster
	proxy *faultProxy
	tls   *chaosTLS // nil: plaintext
}

// newCluster starts size nodes of bin.
func newCluster(t testing.TB, bin string, dir string, size int, withTLS bool, logLevel string) *cluster {
	t.Helper()
	c := &cluster{}
	cfg := proc.Config{
		Bin: bin, Dir: dir, Size: size,
		Admin:    true, // the disk-stall nemesis's hook (-tags faultinject) is on the admin address
		PeerHost: peerHost,
		// The flood nemesis's small limits (flood_test.go), in every run: a healthy client never comes near them.
		Args: append([]string{"--snapshot-entries=5000", "--snapshot-catchup=1000"}, floodArgs...),
		Env: func(i int) []string {
			proxy := c.proxy.url(i)
			return append([]string{"HTTPS_PROXY=" + proxy, "https_proxy=" + proxy, "HTTP_PROXY=", "http_proxy=", "NO_PROXY=", "no_proxy="}, connFloodEnv...)
		},
	}
	if logLevel != "" {
		cfg.Args = append(cfg.Args, "--log-level="+logLevel) // after proc's own --log-level=info: the last wins
	}
	if withTLS {
		c.tls = newChaosTLS(t, certsDir(dir))
		// A node's name changes when the membership nemesis replaces it: its certificate follows.
		cfg.NodeArgs = func(i int) []string { return c.tls.nodeArgs(c.Nodes[i].Name) }
		cfg.ClientTLS = c.tls.client
	}
	cfg.NodeArgs = withAuditLog(cfg.NodeArgs, dir, func(i int) string { return c.Nodes[i].Name })
	c.Cluster = proc.New(t, cfg)
	var peers []string
	for _, n := range c.Nodes {
		peers = append(peers, n.PeerAddr)
	}
	p, err := newFaultProxy(peers)
	if err != nil {
		t.Fatal(err)
	}
	c.proxy = p
	t.Cleanup(func() { c.Close(); p.close() }) // the processes first, then their proxy
	for i := range c.Nodes {
		c.Start(i)
	}
	if _, _, err := c.WaitLeader(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	return c
}

// pause SIGSTOPs node i; resume SIGCONTs it.
func (c *cluster) pause(i int)  { c.Signal(i, syscall.SIGSTOP) }
func (c *cluster) resume(i int) { c.Signal(i, syscall.SIGCONT) }

// healAll resumes paused nodes, restarts dead ones and heals every link.
func (c *cluster) healAll() {
	c.proxy.heal()
	for i := range c.Nodes {
		c.resume(i)
		if !c.Running(i) {
			c.Start(i)
		}
	}
}

// nodeState is one node's applied lease state, read locally (serializable), at a known applied index.
type nodeState struct {
	applied uint64
	leases  []*leasepb.Lease // remaining_ms cleared (only the leader knows it)
	slots   []*leasepb.Lease // semaphore slots, kept apart from the plain leases (semaphore_test.go)
}

func (c *cluster) localState(ctx context.Context, i int) (nodeState, error) {
	var st nodeState
	before, err := c.Status(ctx, i)
	if err != nil {
		return st, err
	}
	page := ""
	for range 10000 {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := c.Leases(i).List(cctx, &leasepb.ListRequest{Limit: 1000, PageToken: page, Serializable: true})
		cancel()
		if err != nil {
			return st, err
		}
		for _, l := range resp.GetLeases() {
			l = proto.Clone(l).(*leasepb.Lease)
			l.RemainingMs = 0
			if l.GetLimit() > 0 {
				st.slots = append(st.slots, l)
				continue
			}
			st.leases = append(st.leases, l)
		}
		if page = resp.GetNextPageToken(); page == "" {
			break
		}
	}
	after, err := c.Status(ctx, i)
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
	err := proc.Poll(timeout, func() bool {
		states = states[:0]
		for i := range c.Nodes {
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

// rejoinTimeout bounds how long a restarted node may take to rejoin before its kill fault ends anyway.
const rejoinTimeout = 10 * time.Second

// stopBound is how long a SIGTERMed node may take to exit: the server's own drain of client calls and
// streams (2 s) and its leadership hand-off, with room for a loaded machine.
const stopBound = 15 * time.Second

// stopNode SIGTERMs node i and waits for it to exit; a node still running after stopBound is a finding
// ("shutdown") and is killed.
func (r *run) stopNode(i int) {
	start := time.Now()
	r.c.Signal(i, syscall.SIGTERM)
	if err := proc.Poll(stopBound, func() bool { return !r.c.Running(i) }); err != nil {
		r.c.Kill(i)
		r.mu.Lock()
		r.shutdownFindings = append(r.shutdownFindings, fmt.Sprintf("%s still ran %v after SIGTERM (at %v into the run)",
			r.c.Nodes[i].Name, stopBound, start.Sub(r.hist.start).Round(time.Millisecond)))
		r.mu.Unlock()
	}
}

// restartAndRejoin starts node i again and returns once it has rejoined — it answers, knows a leader, and
// has applied what the cluster had committed when it started — or after rejoinTimeout. A kill fault ends
// then, not when the process is launched: a node still starting or replaying its log is no healthy
// member yet, and the L1 checker must not count it in a majority (soak E: a follower restarted 1.8 s
// before a leader's disk stall was elected while it caught up, and a lease renewed through it was lost).
func (r *run) restartAndRejoin(ctx context.Context, i int) {
	commit := r.committedElsewhere(ctx, i)
	r.c.Start(i)
	_ = r.waitRejoin(ctx, i, commit)
}

// committedElsewhere is the highest commit index the nodes other than i report.
func (r *run) committedElsewhere(ctx context.Context, i int) uint64 {
	var commit uint64
	for j := range r.c.Nodes {
		if st, err := r.c.Status(ctx, j); j != i && err == nil {
			commit = max(commit, st.GetCommitIndex())
		}
	}
	return commit
}

// waitRejoin waits until node i answers, knows a leader and has applied commit, or ctx ends (nil), or
// rejoinTimeout passes (an error saying how far it got).
func (r *run) waitRejoin(ctx context.Context, i int, commit uint64) error {
	var last string
	err := proc.Poll(rejoinTimeout, func() bool {
		st, err := r.c.Status(ctx, i)
		switch {
		case err != nil:
			last = err.Error()
		default:
			last = fmt.Sprintf("leader %d, applied %d of %d", st.GetLeaderId(), st.GetAppliedIndex(), commit)
		}
		return ctx.Err() != nil || (err == nil && st.GetLeaderId() != 0 && st.GetAppliedIndex() >= commit)
	})
	if err != nil {
		return fmt.Errorf("%w (last status: %s)", err, last)
	}
	return nil
}
