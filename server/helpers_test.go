package server_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest"
)

// TestMain fails on any goroutine a test leaves behind, but one: memberlist's Shutdown does not wait for a
// failure probe in progress, which ends by itself at its ack deadline (at most a probe interval later).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"))
}

func code(err error) codes.Code { return status.Code(err) }

// ctxT bounds a test's calls: generous, since a loaded 2-core machine running -race can take 30 ms an acquire.
func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
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

// retrying calls fn through any running node in turn, retrying Unavailable, DeadlineExceeded and Canceled
// (the test closed that node's conn), as the SDK does: a leader change on a loaded machine is no failure.
func retrying[T any](c *servertest.Cluster, ctx context.Context, fn func(context.Context, leasepb.LeasesClient) (T, error)) (T, error) {
	for attempt := 0; ; attempt++ {
		cl := c.Leases(attempt % c.Size())
		if cl == nil {
			continue
		}
		callCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := fn(callCtx, cl)
		cancel()
		if ctx.Err() != nil {
			var zero T
			return zero, ctx.Err()
		}
		switch code(err) {
		case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		default:
			return resp, err
		}
		time.Sleep(20 * time.Millisecond) // backoff between retries
	}
}

// retryingIDs numbers the request ids acquireRetrying draws.
var retryingIDs atomic.Uint64

// acquireRetrying acquires through any running node, retrying with the same request id. A call without
// one draws one (each call is one intent): a retry after a lost answer must find its own grant, not the
// lease this very caller already holds.
func acquireRetrying(c *servertest.Cluster, ctx context.Context, req *leasepb.AcquireRequest) (*leasepb.AcquireResponse, error) {
	if req.GetRequestId() == "" {
		req = proto.CloneOf(req)
		req.RequestId = fmt.Sprintf("retrying/%d", retryingIDs.Add(1))
	}
	return retrying(c, ctx, func(ctx context.Context, cl leasepb.LeasesClient) (*leasepb.AcquireResponse, error) {
		return cl.Acquire(ctx, req)
	})
}

// stopBehind stops node f and returns an index its log does not reach: that of an entry written once it
// stopped, a grant of resource marker (a grant's token is its entry's index). Neither its own applied
// index (it may hold entries it has not applied) nor the running nodes' last indexes will do: a leader
// sends new entries while it writes them itself, so a follower may hold an entry the leader's stored log
// does not show yet (TestFollowerRestartedAfterCompactionCatchesUpBySnapshot failed a CI run so).
func stopBehind(t *testing.T, c *servertest.Cluster, f int, marker string) uint64 {
	t.Helper()
	c.Stop(f)
	resp, err := acquireRetrying(c, ctxT(t), &leasepb.AcquireRequest{Resource: marker, Holder: "h", TtlMs: 60_000, RequestId: marker})
	if err != nil {
		t.Fatalf("the entry after %s stopped: %v", c.Config(f).Name, err)
	}
	return resp.GetLease().GetToken()
}

// compactPast acquires leases named prefix/N (a 60 s TTL) until every running node's raft log starts
// after index, so that a follower stopped at index can catch up only by snapshot. A fixed number of
// entries is not enough: each voter snapshots at its own point in the interval, and in the background.
func compactPast(t *testing.T, c *servertest.Cluster, index uint64, prefix string) {
	t.Helper()
	ctx := ctxT(t)
	for i := 0; ; i++ {
		compacted := true
		for n := range c.Size() {
			if s := c.Node(n); s != nil && s.LogFirstIndex() <= index+1 { // nil: stopped
				compacted = false
			}
		}
		if compacted {
			return
		}
		if i == 2000 {
			t.Fatalf("2,000 entries after index %d, a node's log still holds it", index)
		}
		if _, err := acquireRetrying(c, ctx, &leasepb.AcquireRequest{Resource: fmt.Sprintf("%s/%d", prefix, i), Holder: "h", TtlMs: 60_000, RequestId: fmt.Sprint(prefix, i)}); err != nil {
			t.Fatal(err)
		}
	}
}

// listRetrying lists through any running node.
func listRetrying(c *servertest.Cluster, ctx context.Context, req *leasepb.ListRequest) (*leasepb.ListResponse, error) {
	return retrying(c, ctx, func(ctx context.Context, cl leasepb.LeasesClient) (*leasepb.ListResponse, error) {
		return cl.List(ctx, req)
	})
}

// startSingleNode starts a one-node cluster on loopback from cfg (filling in its name, data dir,
// addresses and initial cluster), waits until it leads, and stops it when the test ends.
func startSingleNode(t *testing.T, cfg *server.Config) *server.Server {
	skipShort(t)
	t.Helper()
	cfg.Name, cfg.DataDir = "n1", filepath.Join(t.TempDir(), "n1")
	lis := server.Listeners{Client: listenLocal(t), Peer: listenLocal(t)}
	cfg.ClientAddr, cfg.PeerAddr = lis.Client.Addr().String(), lis.Peer.Addr().String()
	cfg.InitialCluster = map[string]string{"n1": cfg.PeerAddr}
	s, err := server.New(*cfg, lis)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() { _ = s.Close() })
	eventually(t, 5*time.Second, "leader", s.IsLeader)
	return s
}

// heldDetail is the LeaseHeld detail of an Acquire's refusal (nil: none).
func heldDetail(err error) *leasepb.LeaseHeld {
	st, _ := statusOf(err)
	for _, d := range st.Details() {
		if h, ok := d.(*leasepb.LeaseHeld); ok {
			return h
		}
	}
	return nil
}

// startWithRegistries starts an n-node cluster whose nodes each register their metrics in a registry of
// their own, which reg(i) returns for node i. tweak, if not nil, adjusts each node's config further.
func startWithRegistries(t *testing.T, n int, tweak func(*server.Config)) (c *servertest.Cluster, reg func(i int) *prometheus.Registry) {
	regs := map[string]*prometheus.Registry{}
	c = servertest.Start(t, n, func(cfg *server.Config) {
		regs[cfg.Name] = prometheus.NewRegistry()
		cfg.Registerer = regs[cfg.Name]
		if tweak != nil {
			tweak(cfg)
		}
	})
	return c, func(i int) *prometheus.Registry { return regs[c.Config(i).Name] }
}

// appliedProposals is how many of its own proposals a node applied (leased_proposals_total, applied),
// read from its registry.
func appliedProposals(t *testing.T, reg *prometheus.Registry) float64 {
	return gather(t, reg).value("leased_proposals_total", "outcome", "applied")
}
