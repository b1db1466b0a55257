package client_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/client"
)

// replayingLeases answers every Acquire as a replay of an old grant with remainingMs left of a 10s TTL,
// and every Renew with the full TTL.
type replayingLeases struct {
	leasepb.UnimplementedLeasesServer
	remainingMs int64
	renews      atomic.Int32
}

func (f *replayingLeases) Acquire(_ context.Context, req *leasepb.AcquireRequest) (*leasepb.AcquireResponse, error) {
	return &leasepb.AcquireResponse{Replayed: true, Lease: &leasepb.Lease{
		Resource: req.GetResource(), Holder: req.GetHolder(), Token: 42, TtlMs: 10_000, RemainingMs: f.remainingMs,
	}}, nil
}

func (f *replayingLeases) Renew(context.Context, *leasepb.RenewRequest) (*leasepb.RenewResponse, error) {
	f.renews.Add(1)
	return &leasepb.RenewResponse{TtlMs: 10_000}, nil
}

// serveLeases serves a fake Leases service on loopback for the test and returns its address.
func serveLeases(t *testing.T, s leasepb.LeasesServer) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	leasepb.RegisterLeasesServer(srv, viaUnary{s})
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return lis.Addr().String()
}

// TestReplayedAcquireIsTrustedOnlyForWhatRemains is issue #11 (c): a replayed answer repeats an old grant,
// which the cluster expires after remaining_ms, not after a fresh TTL. The SDK used to count a full TTL.
func TestReplayedAcquireIsTrustedOnlyForWhatRemains(t *testing.T) {
	f := &replayingLeases{remainingMs: 5000}
	c := newClient(t, []string{serveLeases(t, f)}, nil)
	l, err := c.Acquire(ctxT(t), "replay/long", client.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if left := l.Remaining(); left > 5*time.Second || left < 4*time.Second {
		t.Fatalf("a replay with 5s remaining is trusted for %v", left)
	}
}

// A replay with too little left to wait for the keeper is renewed before Acquire returns.
func TestReplayedAcquireWithLittleLeftIsRenewedAtOnce(t *testing.T) {
	f := &replayingLeases{remainingMs: 50}
	c := newClient(t, []string{serveLeases(t, f)}, nil)
	l, err := c.Acquire(ctxT(t), "replay/short", client.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if f.renews.Load() == 0 {
		t.Fatal("a replay with 50ms left was not renewed before Acquire returned")
	}
	if left := l.Remaining(); left < 9*time.Second {
		t.Fatalf("after the renewal the lease is trusted for %v, want about a TTL", left)
	}
	select {
	case <-l.Done():
		t.Fatalf("lease ended: %v", l.Err())
	default:
	}
}
