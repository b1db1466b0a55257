package client_test

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leased/leased/client"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest"
)

// appliedProposals is how many client commands the node proposed and applied (leased_proposals_total).
func appliedProposals(t *testing.T, reg *prometheus.Registry) float64 {
	return outcomeCount(t, reg, "leased_proposals_total", "applied")
}

// TestHeldAcquireWritesNothing: an Acquire that finds the resource held, with the request id the SDK
// drew for it or one given WithFreshRequestID, costs the cluster no log entry (the first attempt says
// its id is fresh); one WithRequestID, which may repeat an earlier call's id, is refused through the log
// as before. A waiting Acquire (whose first ask is such a refusal) is still granted when the holder
// releases.
func TestHeldAcquireWritesNothing(t *testing.T) {
	reg := prometheus.NewRegistry()
	cluster := servertest.Start(t, 1, func(cfg *server.Config) { cfg.Registerer = reg })
	ctx := ctxT(t)
	a := newClient(t, cluster.Endpoints(), func(cfg *client.Config) { cfg.Holder = "a" })
	b := newClient(t, cluster.Endpoints(), func(cfg *client.Config) { cfg.Holder = "b" })
	// A minute: no renewal of it (which may be a Renew entry, if it was checkpointed idle) within the test.
	held, err := a.Acquire(ctx, "r", client.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	entries := func(acquire func() error) float64 {
		t.Helper()
		before := appliedProposals(t, reg)
		var he *client.HeldError
		if err := acquire(); !errors.As(err, &he) || he.Holder != "a" {
			t.Fatalf("acquire of the held resource = %v, want held by a", err)
		}
		return appliedProposals(t, reg) - before
	}
	if n := entries(func() error { _, err := b.Acquire(ctx, "r"); return err }); n != 0 {
		t.Errorf("a held acquire with the SDK's own request id proposed %v entries, want none", n)
	}
	if n := entries(func() error { _, err := b.Acquire(ctx, "r", client.WithFreshRequestID("new")); return err }); n != 0 {
		t.Errorf("a held acquire WithFreshRequestID proposed %v entries, want none", n)
	}
	if n := entries(func() error { _, err := b.Acquire(ctx, "r", client.WithRequestID("new")); return err }); n != 1 {
		t.Errorf("a held acquire WithRequestID proposed %v entries, want 1", n)
	}

	waited := make(chan error, 1)
	go func() {
		l, err := b.Acquire(ctx, "r", client.WithWait())
		if err == nil {
			err = l.Release(ctx)
		}
		waited <- err
	}()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("the waiting acquire: %v", err)
	}
}
