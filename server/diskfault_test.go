package server_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server"
)

// oneNodeWithFault builds, without starting it, a one-node cluster whose raft log sits behind a
// StorageFault; mutate, if set, changes its config first.
func oneNodeWithFault(t *testing.T, mutate func(*server.Config)) (server.Config, server.Listeners, *server.Server, *server.StorageFault) {
	t.Helper()
	cfg := server.TestConfig()
	cfg.Name, cfg.DataDir = "n1", filepath.Join(t.TempDir(), "n1")
	if mutate != nil {
		mutate(&cfg)
	}
	lis := server.Listeners{Client: listenLocal(t), Peer: listenLocal(t)}
	cfg.ClientAddr, cfg.PeerAddr = lis.Client.Addr().String(), lis.Peer.Addr().String()
	cfg.InitialCluster = map[string]string{"n1": cfg.PeerAddr}
	s, fault, err := server.NewWithStorageFault(cfg, lis)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, lis, s, fault
}

// TestFailingDiskStopsTheNodeAndAcknowledgesNothingUnpersisted: when the raft log can no longer be
// written (a full disk), the node stops with a clear error, the write that could not be persisted is not
// acknowledged, and after a restart on a working disk every acknowledged write is there and the failed one
// is not.
func TestFailingDiskStopsTheNodeAndAcknowledgesNothingUnpersisted(t *testing.T) {
	ctx := ctxT(t)
	cfg, lis, s, fault := oneNodeWithFault(t, nil)
	s.Start()
	defer s.Close()
	cl := dial(t, cfg.ClientAddr)
	eventually(t, 5*time.Second, "leader", s.IsLeader)
	acked, err := cl.Acquire(ctx, &leasepb.AcquireRequest{Resource: "kept", Holder: "h", TtlMs: 60_000})
	if err != nil {
		t.Fatal(err)
	}

	fault.Fail(syscall.ENOSPC)
	callCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if resp, err := cl.Acquire(callCtx, &leasepb.AcquireRequest{Resource: "lost", Holder: "h", TtlMs: 60_000}); err == nil {
		t.Fatalf("a write was acknowledged after the disk failed: %v", resp)
	}
	select {
	case <-s.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the node kept running on a failing disk")
	}
	if !errors.Is(s.Err(), syscall.ENOSPC) {
		t.Fatalf("node error = %v, want it to say the disk is full", s.Err())
	}
	if err := s.Close(); err != nil {
		t.Logf("close after the fault: %v", err)
	}

	// Restart on the same data dir, with a working disk.
	cfg.ClientAddr, cfg.PeerAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.InitialCluster = map[string]string{"n1": lis.Peer.Addr().String()}
	again, err := server.New(cfg, server.Listeners{Client: listenLocal(t), Peer: listenLocal(t)})
	if err != nil {
		t.Fatal(err)
	}
	again.Start()
	defer again.Close()
	cl2 := dial(t, again.ClientAddr())
	eventually(t, 5*time.Second, "leader after restart", again.IsLeader)
	got, err := cl2.Get(ctx, &leasepb.GetRequest{Resource: "kept"})
	if err != nil || got.GetLease().GetToken() != acked.GetLease().GetToken() {
		t.Fatalf("acknowledged lease after restart: %v, %v", got, err)
	}
	if _, err := cl2.Get(ctx, &leasepb.GetRequest{Resource: "lost"}); code(err).String() != "NotFound" {
		t.Fatalf("the unacknowledged write survived: %v", err)
	}
}

func listenLocal(t *testing.T) net.Listener {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func dial(t *testing.T, addr string) leasepb.LeasesClient {
	return leasepb.NewLeasesClient(dialConn(t, addr))
}

func dialConn(t *testing.T, addr string) *grpc.ClientConn {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// TestWritesGoOnWhileASnapshotIsWritten: a snapshot's write to raft.db (tens of MB at a million leases)
// runs beside the Ready loop, not on it. With the write held, acquires keep committing and the loop keeps
// ticking; once it is let go the log is compacted behind it, and the next snapshot follows in turn.
func TestWritesGoOnWhileASnapshotIsWritten(t *testing.T) {
	ctx := ctxT(t)
	cfg, _, s, fault := oneNodeWithFault(t, func(cfg *server.Config) { cfg.SnapshotEntries, cfg.SnapshotCatchUp = 20, 2 })
	started, release := fault.HoldSnapshots()
	released := false
	defer func() {
		if !released {
			release()
		}
	}()
	s.Start()
	defer s.Close()
	cl := dial(t, cfg.ClientAddr)
	eventually(t, 5*time.Second, "leader", s.IsLeader)
	acquire := func(i int) {
		t.Helper()
		callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if _, err := cl.Acquire(callCtx, &leasepb.AcquireRequest{Resource: fmt.Sprintf("r/%d", i), Holder: "h", TtlMs: 60_000}); err != nil {
			t.Fatalf("acquire %d while a snapshot is written: %v", i, err)
		}
	}
	i := 0
	for ; ; i++ {
		acquire(i)
		select {
		case <-started:
		default:
			if i > 100 {
				t.Fatal("no snapshot began after 100 acquires with SnapshotEntries 20")
			}
			continue
		}
		break
	}
	ticks := s.Ticks()
	for range 3 * cfg.SnapshotEntries { // more than two snapshots' worth, all while the first is held
		i++
		acquire(i)
	}
	eventually(t, 5*time.Second, "the loop to tick", func() bool { return s.Ticks() > ticks+3 })
	if n := fault.Compactions(); n != 0 {
		t.Fatalf("%d compactions while the snapshot is held", n)
	}
	released = true
	release()
	eventually(t, 10*time.Second, "the log to be compacted behind the snapshot", func() bool { return fault.Compactions() > 0 })
	// And the snapshots go on, each in turn. The backlog may have made another snapshot already; the next
	// comes at most an interval and a half after it (nextSnapshotAt).
	done := fault.Compactions()
	for range cfg.SnapshotEntries*3/2 + 1 {
		i++
		acquire(i)
	}
	eventually(t, 10*time.Second, "the next compaction", func() bool { return fault.Compactions() > done })
}

// TestStalledLeaderNamesNoLeader: a leader whose loop is blocked in a raft log write for longer than an
// election timeout stops claiming to lead — Status reports the stall and no leader (nor does its response
// header), the health service says NOT_SERVING, Leader (the rule of /readyz) is 0 — and claims it again
// once the write returns, with the write that waited on it acknowledged. It used to answer Status as the
// leader all through the stall: clients' discovery kept choosing it over the leader its peers elected.
func TestStalledLeaderNamesNoLeader(t *testing.T) {
	ctx := ctxT(t)
	cfg, _, s, fault := oneNodeWithFault(t, nil)
	s.Start()
	defer s.Close()
	conn := dialConn(t, cfg.ClientAddr)
	cl, cluster, health := leasepb.NewLeasesClient(conn), leasepb.NewClusterClient(conn), healthpb.NewHealthClient(conn)
	eventually(t, 5*time.Second, "leader", s.IsLeader)
	status := func() *leasepb.StatusResponse {
		t.Helper()
		st, err := cluster.Status(ctx, &leasepb.StatusRequest{})
		if err != nil {
			t.Fatalf("Status: %v", err)
		}
		return st
	}
	serving := func() bool {
		t.Helper()
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatalf("health check: %v", err)
		}
		return resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
	}
	eventually(t, 5*time.Second, "SERVING", serving)
	if st := status(); st.GetLoopStalledMs() != 0 || st.GetLeaderId() != s.ID() || st.GetHeader().GetLeaderAddr() != cfg.ClientAddr {
		t.Fatalf("before the stall: %v", st)
	}

	release := fault.HoldSaves()
	defer release()
	acked := make(chan error, 1)
	go func() {
		_, err := cl.Acquire(ctx, &leasepb.AcquireRequest{Resource: "waits", Holder: "h", TtlMs: 60_000})
		acked <- err
	}()
	eventually(t, 5*time.Second, "Status to report the stall", func() bool { return status().GetLoopStalledMs() > 0 })
	st := status()
	if st.GetRole() != leasepb.Role_ROLE_LEADER || st.GetLeaderId() != 0 || st.GetHeader().GetLeaderAddr() != "" {
		t.Errorf("a stalled leader answered role %v, leader %x, header leader %q; want its raft role and no leader",
			st.GetRole(), st.GetLeaderId(), st.GetHeader().GetLeaderAddr())
	}
	if s.Leader() != 0 {
		t.Errorf("Leader() = %x while stalled, want 0 (/readyz would say ready)", s.Leader())
	}
	eventually(t, 5*time.Second, "NOT_SERVING while stalled", func() bool { return !serving() })

	release()
	if err := <-acked; err != nil {
		t.Fatalf("the acquire that waited on the stalled write: %v", err)
	}
	eventually(t, 5*time.Second, "the stall to end", func() bool {
		st := status()
		return st.GetLoopStalledMs() == 0 && st.GetLeaderId() == s.ID()
	})
	eventually(t, 5*time.Second, "SERVING again", serving)
}
