package client_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leased/leased/client"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest"
)

// batchedWrites is the number of writes the node served in Batch calls and Writes stream requests, and the
// number of those calls and requests (leased_batch_writes' sum and count).
func batchedWrites(t *testing.T, reg *prometheus.Registry) (writes, requests float64) {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "leased_batch_writes" {
			h := f.GetMetric()[0].GetHistogram()
			return h.GetSampleSum(), float64(h.GetSampleCount())
		}
	}
	t.Fatal("no leased_batch_writes")
	return 0, 0
}

// churn has workers goroutines acquire, renew and release a lease each, all at once, and fails the test on
// any error.
func churn(ctx context.Context, t *testing.T, c *client.Client, prefix string, workers int) {
	t.Helper()
	start := make(chan struct{})
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for i := range workers {
		wg.Go(func() {
			<-start
			l, err := c.Acquire(ctx, fmt.Sprintf("%s/%d", prefix, i), client.WithTTL(30*time.Second))
			if err != nil {
				errs <- err
				return
			}
			if _, err := c.Renew(ctx, l.Resource(), l.Token()); err != nil {
				errs <- fmt.Errorf("renew: %w", err)
			}
			if err := l.Release(ctx); err != nil {
				errs <- fmt.Errorf("release: %w", err)
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestConcurrentWritesTravelInBatches: writes that goroutines of one client make at once reach the node
// together (requests on the Writes stream carrying several) and each gets its own answer; with
// Config.NoBatching every write is its own call.
func TestConcurrentWritesTravelInBatches(t *testing.T) {
	reg := prometheus.NewRegistry()
	cluster := servertest.Start(t, 1, func(cfg *server.Config) { cfg.Registerer = reg })
	ctx := ctxT(t)
	c := newClient(t, cluster.Endpoints(), nil)
	churn(ctx, t, c, "batched", 48)
	batched, requests := batchedWrites(t, reg)
	if batched != 144 || requests >= batched {
		t.Fatalf("48 goroutines acquired, renewed and released at once: %v writes in %v requests; want all 144, several to a request", batched, requests)
	}
	t.Logf("144 writes travelled in %v requests", requests)
	alone := newClient(t, cluster.Endpoints(), func(cfg *client.Config) { cfg.NoBatching = true })
	churn(ctx, t, alone, "alone", 48)
	if got, _ := batchedWrites(t, reg); got != batched {
		t.Fatalf("with NoBatching, %v more writes travelled in batches", got-batched)
	}
}
