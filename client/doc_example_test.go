package client_test

// The examples of docs/client.md: each Go block there is an excerpt of one of these functions
// (tests/e2e's TestDocGoBlocksAreExamples checks it), so running them runs the docs' code.

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/leased/leased/client"
	"github.com/leased/leased/client/fence"
	"github.com/leased/leased/client/fence/memfence"
)

// Connect to the local cluster of scripts/cluster.sh; the comments are the defaults. (Compiled only: it
// names fixed addresses.)
func ExampleNew() {
	c, err := client.New(client.Config{
		Endpoints: []string{"127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"},
		// Holder:         "host:pid" by default
		// RequestTimeout: 5s (a whole call, when its context has no deadline), DialTimeout: 5s (connecting)
		// PingInterval:   10s, PingTimeout: 3s (HTTP/2 keepalive pings)
		// ClockDrift:     0.01 (1% clock-rate difference allowed), MinDriftMargin: 20ms
		// Registerer:     nil (no metrics); a prometheus.Registerer gets the leased_client_* series
		// NoBatching:     false (quick writes travel on a Writes stream, those made at once as one request; below)
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
}

// An Acquire whose outcome is unknown is asked again under its request id: the retry returns the grant
// the first call made, if it made one.
func ExampleOutcomeRequestID() {
	endpoints, stop := exampleCluster()
	defer stop()
	ctx := context.Background()
	c, err := client.New(client.Config{Endpoints: endpoints})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	l, err := c.Acquire(ctx, "db/primary")
	if id, ok := client.OutcomeRequestID(err); ok {
		// The grant may exist: claim it (or learn it never happened) before giving up on it.
		l, err = c.Acquire(ctx, "db/primary", client.WithRequestID(id))
	}
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("held:", l.Token() > 0)
	// Output:
	// held: true
}

// Hold a lease with a value, claim its token at the store and write through the fence.
func ExampleClient_Acquire_fenced() {
	endpoints, stop := exampleCluster()
	defer stop()
	ctx := context.Background()
	c, err := client.New(client.Config{Endpoints: endpoints})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	store := memfence.New()

	lease, err := c.Acquire(ctx, "db/primary",
		client.WithTTL(10*time.Second),
		client.WithValue([]byte("10.0.0.1:5432")), // optional, ≤ 4 KiB
		// client.WithWait(),                      // block until granted, FIFO among waiters
		// client.WithLockDelay(5*time.Second),    // keep the resource ungrantable after an expiry
	)
	if err != nil {
		log.Fatal(err)
	}
	// Claim the token at the store before anything else (see "Claim before the first write").
	if err := store.Claim(ctx, "db/primary", lease.Token()); err != nil {
		log.Fatal(err)
	}
	err = lease.Fenced(ctx, func(ctx context.Context, token uint64) error {
		return store.Write(ctx, "db/primary", token, func(tx *memfence.Tx) error {
			tx.Put("db/primary/config", []byte("max_connections=100"))
			return nil
		})
	})
	fmt.Println("fenced write:", err)
	// Output:
	// fenced write: <nil>
}

// A leader announces a new value under the same token.
func ExampleLease_Proclaim() {
	endpoints, stop := exampleCluster()
	defer stop()
	ctx := context.Background()
	c, err := client.New(client.Config{Endpoints: endpoints})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	lease, err := c.Campaign(ctx, "elections/scheduler", []byte("10.0.0.1:8080"))
	if err != nil {
		log.Fatal(err)
	}

	err = lease.Proclaim(ctx, []byte("10.0.0.2:8080")) // any lease you hold
	if err != nil {
		log.Fatal(err)
	}
	info, err := c.Proclaim(ctx, "elections/scheduler", lease.Token(), []byte("10.0.0.3:8080")) // by (resource, token), e.g. from a tool
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(info.Value), "same token:", info.Token == lease.Token())
	// Output:
	// 10.0.0.3:8080 same token: true
}

// A slot of a counting semaphore of four, and who holds the slots.
func ExampleClient_Slots() {
	endpoints, stop := exampleCluster()
	defer stop()
	ctx := context.Background()
	c, err := client.New(client.Config{Endpoints: endpoints, Holder: "transcoder-1"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	slot, err := c.Acquire(ctx, "pools/transcoders", client.WithLimit(4), client.WithWait(), client.WithTTL(30*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	slots, err := c.Slots(ctx, "pools/transcoders") // who holds which slot now, in token order
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(slots), "slot held, by", slots[0].Holder)
	// ... work while <-slot.Done() is open, then
	err = slot.Release(ctx)
	fmt.Println("released:", err)
	// Output:
	// 1 slot held, by transcoder-1
	// released: <nil>
}

// A new holder claims its token at the store before its first write, so a paused former holder's late
// write is refused even before the new holder writes anything.
func Example_claimBeforeTheFirstWrite() {
	endpoints, stop := exampleCluster()
	defer stop()
	ctx := context.Background()
	c, err := client.New(client.Config{Endpoints: endpoints})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	f := memfence.New()

	fmt.Println("claimed:", claimThenWrite(ctx, c, f))
	err = f.Write(ctx, "orders/42", 1, func(tx *memfence.Tx) error { return nil }) // a former holder's token
	fmt.Println("late write refused:", errors.Is(err, fence.ErrStaleToken))
	// Output:
	// claimed: <nil>
	// late write refused: true
}

// claimThenWrite is the recipe of docs/client.md, "Claim before the first write".
func claimThenWrite(ctx context.Context, c *client.Client, f *memfence.Store) error {
	lease, err := c.Acquire(ctx, "orders/42", client.WithTTL(10*time.Second))
	if err != nil {
		return err
	}
	if err := f.Claim(ctx, "orders/42", lease.Token()); err != nil {
		return err // errors.Is(err, fence.ErrStaleToken): a newer holder exists; this lease is already stale
	}
	// ... later writes with lease.Token() ...
	return lease.Release(ctx)
}
