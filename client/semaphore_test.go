package client_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/client"
	"github.com/leased/leased/server/servertest"
)

// TestSemaphoreNeverGrantsMoreThanLimit: many goroutines over three clients take slots of one semaphore
// of 3 (waiting FIFO), each holding its slot briefly. At no moment do more than 3 hold a slot, as the
// holders count themselves and as the cluster reports the slots; every grant has its own token.
func TestSemaphoreNeverGrantsMoreThanLimit(t *testing.T) {
	const (
		limit   = 3
		workers = 10
		rounds  = 3
	)
	cl := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	clients := make([]*client.Client, 3)
	for i := range clients {
		clients[i] = newClient(t, cl.Endpoints(), func(cfg *client.Config) { cfg.Holder = fmt.Sprintf("c%d", i) })
	}
	var (
		mu      sync.Mutex
		inside  int
		most    int
		tokens  = map[uint64]bool{}
		wg      sync.WaitGroup
		stopped = make(chan struct{})
	)
	for w := range workers {
		wg.Go(func() {
			c := clients[w%len(clients)]
			for range rounds {
				l, err := c.Acquire(ctx, "pool/workers", client.WithLimit(limit), client.WithWait(), client.WithTTL(5*time.Second))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				inside++
				most = max(most, inside)
				dup := tokens[l.Token()]
				tokens[l.Token()] = true
				mu.Unlock()
				if dup || l.Limit() != limit {
					t.Errorf("slot token %d granted twice, or limit %d", l.Token(), l.Limit())
				}
				select { // hold the slot a moment, so that slots are contended
				case <-time.After(20 * time.Millisecond):
				case <-l.Done():
					t.Errorf("slot %d lost while held: %v", l.Token(), l.Err())
				}
				mu.Lock()
				inside--
				mu.Unlock()
				if err := l.Release(ctx); err != nil {
					t.Error(err)
				}
			}
		})
	}
	// Meanwhile the cluster's own view never shows more than limit slots.
	var observer sync.WaitGroup
	observer.Go(func() {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopped:
				return
			case <-tick.C:
			}
			slots, err := clients[0].Slots(ctx, "pool/workers")
			if err == nil && len(slots) > limit {
				t.Errorf("the cluster reports %d slots of %d", len(slots), limit)
			}
		}
	})
	wg.Wait()
	close(stopped)
	observer.Wait()
	if most > limit || most < 2 {
		t.Fatalf("at most %d held slots at once, want 2..%d", most, limit)
	}
	if len(tokens) != workers*rounds {
		t.Fatalf("%d distinct tokens for %d grants", len(tokens), workers*rounds)
	}
}

// TestSemaphoreSlotsAreFencedAndFreedOnExpiry: each slot has its own increasing token; a holder that dies
// (no renewals) loses its slot at expiry, and a waiter gets it with a larger token.
func TestSemaphoreSlotsAreFencedAndFreedOnExpiry(t *testing.T) {
	cl := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	c := newClient(t, cl.Endpoints(), nil)
	a, err := c.Acquire(ctx, "pool/db", client.WithLimit(2), client.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// A holder that dies: one raw Acquire with the shortest TTL, never renewed.
	leader := cl.WaitLeader()
	dead, err := cl.Leases(leader).Acquire(ctx, &leasepb.AcquireRequest{Resource: "pool/db", Holder: "dead", TtlMs: 800, Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	if dead.GetLease().GetToken() <= a.Token() {
		t.Fatalf("second slot token %d not above the first %d", dead.GetLease().GetToken(), a.Token())
	}
	slots, err := c.Slots(ctx, "pool/db")
	if err != nil || len(slots) != 2 || slots[0].Token != a.Token() || slots[1].Limit != 2 {
		t.Fatalf("slots = %+v, %v", slots, err)
	}
	_, err = c.Acquire(ctx, "pool/db", client.WithLimit(2), client.WithTTL(5*time.Second))
	var held *client.HeldError
	if !errors.As(err, &held) || held.Limit != 2 || held.Token != a.Token() {
		t.Fatalf("a third slot of two: %v", err)
	}
	b, err := c.Acquire(ctx, "pool/db", client.WithLimit(2), client.WithWait(), client.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if b.Token() <= dead.GetLease().GetToken() {
		t.Fatalf("slot after expiry has token %d, not above %d", b.Token(), dead.GetLease().GetToken())
	}
	if ok, err := c.ValidateToken(ctx, "pool/db", dead.GetLease().GetToken()); err != nil || ok {
		t.Fatalf("the expired slot's token still validates: %v %v", ok, err)
	}
	for _, l := range []*client.Lease{a, b} {
		if ok, err := c.ValidateToken(ctx, "pool/db", l.Token()); err != nil || !ok {
			t.Fatalf("slot %d does not validate: %v %v", l.Token(), ok, err)
		}
	}
}

// TestSemaphoreLimitMismatchIsInvalid: acquirers that disagree on N learn it, and nothing changes.
func TestSemaphoreLimitMismatchIsInvalid(t *testing.T) {
	cl := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	c := newClient(t, cl.Endpoints(), nil)
	if _, err := c.Acquire(ctx, "pool/x", client.WithLimit(2)); err != nil {
		t.Fatal(err)
	}
	_, err := c.Acquire(ctx, "pool/x", client.WithLimit(3))
	if !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "semaphore of 2 slots") || !strings.Contains(err.Error(), "3 slots") {
		t.Fatalf("limit 3 on a semaphore of 2: %v", err)
	}
	if _, err := c.Acquire(ctx, "pool/x"); !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "plain lease") {
		t.Fatalf("a plain lease on a semaphore: %v", err)
	}
	if _, err := c.Acquire(ctx, "pool/y"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(ctx, "pool/y", client.WithLimit(2)); !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "held as a plain lease") {
		t.Fatalf("a slot of a plain lease: %v", err)
	}
	if _, err := c.Acquire(ctx, "pool/z", client.WithLimit(1001)); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("limit above the maximum: %v", err)
	}
	if slots, err := c.Slots(ctx, "pool/x"); err != nil || len(slots) != 1 {
		t.Fatalf("refused acquires changed the semaphore: %+v, %v", slots, err)
	}
}

// TestProclaimKeepsTokenChangesValue: Proclaim changes the value a leader shows, not its token; a
// stale token is refused.
func TestProclaimKeepsTokenChangesValue(t *testing.T) {
	cl := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	c := newClient(t, cl.Endpoints(), nil)
	l, err := c.Acquire(ctx, "svc/leader", client.WithValue([]byte("10.0.0.1:80")))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Proclaim(ctx, []byte("10.0.0.2:80")); err != nil {
		t.Fatal(err)
	}
	info, err := c.Get(ctx, "svc/leader")
	if err != nil || info.Token != l.Token() || string(info.Value) != "10.0.0.2:80" || string(l.Value()) != "10.0.0.2:80" {
		t.Fatalf("after proclaim: %+v, %v (lease value %q)", info, err, l.Value())
	}
	if _, err := c.Proclaim(ctx, "svc/leader", l.Token()+1000, []byte("x")); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("proclaim with a stale token: %v", err)
	}
	if _, err := c.Proclaim(ctx, "svc/leader", l.Token(), make([]byte, 5000)); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("proclaim of an oversized value: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Proclaim(ctx, []byte("y")); !errors.Is(err, client.ErrReleased) {
		t.Fatalf("proclaim after release: %v", err)
	}
}
