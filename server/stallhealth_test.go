package server_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server"
)

// answerWithin bounds every call the stall tests make to a node: a surface that waits on the stalled
// loop or disk misses it by as long as the stall lasts.
const answerWithin = 5 * time.Second

// faultyCluster is a 3-node in-process cluster whose raft logs each sit behind a StorageFault, with a
// metrics registry per node.
type faultyCluster struct {
	cfgs   []server.Config
	nodes  []*server.Server
	faults []*server.StorageFault
	regs   []*prometheus.Registry
}

func startFaultyCluster(t *testing.T) *faultyCluster {
	skipShort(t)
	t.Helper()
	const size = 3
	c := &faultyCluster{}
	lis := make([]server.Listeners, size)
	initial := map[string]string{}
	for i := range size {
		lis[i] = server.Listeners{Client: listenLocal(t), Peer: listenLocal(t)}
		initial[fmt.Sprintf("n%d", i+1)] = lis[i].Peer.Addr().String()
	}
	dir := t.TempDir()
	for i := range size {
		cfg := server.TestConfig()
		cfg.Name = fmt.Sprintf("n%d", i+1)
		cfg.DataDir = filepath.Join(dir, cfg.Name)
		cfg.ClientAddr, cfg.PeerAddr = lis[i].Client.Addr().String(), lis[i].Peer.Addr().String()
		cfg.InitialCluster = initial
		reg := prometheus.NewRegistry()
		cfg.Registerer = reg
		s, fault, err := server.NewWithStorageFault(cfg, lis[i])
		if err != nil {
			t.Fatal(err)
		}
		c.cfgs, c.nodes, c.faults, c.regs = append(c.cfgs, cfg), append(c.nodes, s), append(c.faults, fault), append(c.regs, reg)
	}
	for _, s := range c.nodes {
		s.Start()
		t.Cleanup(func() { _ = s.Close() })
	}
	eventually(t, 10*time.Second, "every node ready", func() bool {
		for _, s := range c.nodes {
			if s.Ready() != nil {
				return false
			}
		}
		return true
	})
	return c
}

func (c *faultyCluster) leader() int {
	for i, s := range c.nodes {
		if s.IsLeader() {
			return i
		}
	}
	return -1
}

// surfaces asks node i's health surfaces — Status, the gRPC health service, its metrics and Ready —
// each within answerWithin, and reports whether all of them say it is unhealthy (stalled). A surface
// that does not answer in time fails the test.
type surfaces struct {
	t       *testing.T
	status  leasepb.ClusterClient
	health  healthpb.HealthClient
	reg     *prometheus.Registry
	node    *server.Server
	name    string
	timeout time.Duration
}

func (c *faultyCluster) surfaces(t *testing.T, i int) surfaces {
	conn := dialConn(t, c.cfgs[i].ClientAddr)
	return surfaces{t: t, status: leasepb.NewClusterClient(conn), health: healthpb.NewHealthClient(conn),
		reg: c.regs[i], node: c.nodes[i], name: c.cfgs[i].Name, timeout: answerWithin}
}

// call runs fn with a deadline and fails the test if it does not return by then.
func (s surfaces) call(what string, fn func(ctx context.Context) error) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	select {
	case err := <-done:
		if err != nil {
			s.t.Fatalf("%s: %s: %v", s.name, what, err)
		}
	case <-ctx.Done():
		s.t.Fatalf("%s: %s did not answer within %v: it waits on the stalled node", s.name, what, s.timeout)
	}
}

// unhealthy asks every surface once and reports whether each says the node is stalled.
func (s surfaces) unhealthy() (all bool, report string) {
	s.t.Helper()
	var st *leasepb.StatusResponse
	s.call("Status", func(ctx context.Context) (err error) {
		st, err = s.status.Status(ctx, &leasepb.StatusRequest{})
		return err
	})
	var hc *healthpb.HealthCheckResponse
	s.call("gRPC health", func(ctx context.Context) (err error) {
		hc, err = s.health.Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	})
	var ready, stalled float64
	s.call("metrics", func(context.Context) error {
		mfs, err := s.reg.Gather()
		if err != nil {
			return err
		}
		for _, mf := range mfs {
			switch mf.GetName() {
			case "leased_ready":
				ready = mf.GetMetric()[0].GetGauge().GetValue()
			case "leased_loop_stalled_seconds":
				stalled = mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		return nil
	})
	var readyErr error
	s.call("Ready", func(context.Context) error { readyErr = s.node.Ready(); return nil })
	all = st.GetLoopStalledMs() > 0 && hc.GetStatus() == healthpb.HealthCheckResponse_NOT_SERVING &&
		ready == 0 && stalled > 0 && errors.Is(readyErr, server.ErrLoopStalled)
	report = fmt.Sprintf("Status loop_stalled_ms %d, health %v, leased_ready %v, leased_loop_stalled_seconds %v, Ready %v",
		st.GetLoopStalledMs(), hc.GetStatus(), ready, stalled, readyErr)
	return all, report
}

// untilUnhealthy polls every surface, each call bounded, until all say the node is stalled.
func (s surfaces) untilUnhealthy() {
	s.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		all, report := s.unhealthy()
		if all {
			s.t.Logf("%s stalled: %s", s.name, report)
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%s: its disk is stalled, yet: %s", s.name, report)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// untilHealthy waits for the node to be ready and SERVING again.
func (s surfaces) untilHealthy() {
	s.t.Helper()
	eventually(s.t, 10*time.Second, s.name+" ready again", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
		defer cancel()
		hc, err := s.health.Check(ctx, &healthpb.HealthCheckRequest{})
		return err == nil && hc.GetStatus() == healthpb.HealthCheckResponse_SERVING && s.node.Ready() == nil
	})
}

// TestStalledFollowerSaysSo: a follower whose disk stops answering (its raft log save blocks, holding
// the log as raftlog does across an fsync) still knows the leader, but it cannot apply or answer a read.
// Its Status, gRPC health, metrics and Ready all answer within a deadline throughout, and all say it is
// stalled: NOT_SERVING, leased_ready 0, ErrLoopStalled. It used to answer /readyz 200 and SERVING, and
// a scrape and Status hung until the disk came back. Once it does, the node is ready again.
func TestStalledFollowerSaysSo(t *testing.T) {
	c := startFaultyCluster(t)
	leader := c.leader()
	f := (leader + 1) % 3
	cl := dial(t, c.cfgs[leader].ClientAddr)
	ctx := ctxT(t)
	if _, err := cl.Acquire(ctx, &leasepb.AcquireRequest{Resource: "before", Holder: "h", TtlMs: 60_000}); err != nil {
		t.Fatal(err)
	}
	s := c.surfaces(t, f)
	if all, report := s.unhealthy(); all {
		t.Fatalf("before the stall: %s", report)
	}

	release := c.faults[f].HoldSaves()
	defer release()
	// A write the follower must append: the leader and the other follower commit it without it.
	if _, err := cl.Acquire(ctx, &leasepb.AcquireRequest{Resource: "during", Holder: "h", TtlMs: 60_000}); err != nil {
		t.Fatalf("acquire with one follower stalled: %v", err)
	}
	s.untilUnhealthy()

	release()
	s.untilHealthy()
}

// TestStalledLeaderSaysSo: the same for the leader. Its peers elect another; the stalled one answers
// every surface within a deadline and says it is stalled until its disk comes back.
func TestStalledLeaderSaysSo(t *testing.T) {
	c := startFaultyCluster(t)
	leader := c.leader()
	s := c.surfaces(t, leader)
	release := c.faults[leader].HoldSaves()
	defer release()
	cl := dial(t, c.cfgs[leader].ClientAddr)
	acked := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := cl.Acquire(ctx, &leasepb.AcquireRequest{Resource: "during", Holder: "h", TtlMs: 60_000})
		acked <- err
	}()
	s.untilUnhealthy()
	release()
	s.untilHealthy()
	<-acked // whatever its outcome: only that it ends
}
