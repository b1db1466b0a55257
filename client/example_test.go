package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/leased/leased/client"
	"github.com/leased/leased/client/fence"
	"github.com/leased/leased/client/fence/memfence"
	"github.com/leased/leased/server"
)

// Hold a lease, claim its token at the store, and write through a fence: the store itself rejects a write
// that carries a stale token, so a holder that paused past its lease cannot overwrite the next holder's work.
func ExampleClient_Acquire() {
	endpoints, stop := exampleCluster()
	defer stop()
	ctx := context.Background()

	c, err := client.New(client.Config{Endpoints: endpoints, Holder: "worker-1"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	store := memfence.New() // stands in for PostgreSQL, Redis or bbolt (see client/fence)

	lease, err := c.Acquire(ctx, "reports/daily", client.WithTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	// Claim the token first: from now on the store refuses an older holder's write, even before ours.
	if err := store.Claim(ctx, "reports/daily", lease.Token()); err != nil {
		log.Fatal(err)
	}
	err = lease.Fenced(ctx, func(ctx context.Context, token uint64) error {
		return store.Write(ctx, "reports/daily", token, func(tx *memfence.Tx) error {
			tx.Put("reports/daily/status", []byte("done"))
			return nil
		})
	})
	fmt.Println("write with the current token:", err)

	// A write with an older token (a holder that paused past its lease) is rejected by the store.
	err = store.Write(ctx, "reports/daily", lease.Token()-1, func(tx *memfence.Tx) error { return nil })
	fmt.Println("stale write rejected:", errors.Is(err, fence.ErrStaleToken))

	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}
	<-lease.Done()
	fmt.Println("after release:", lease.Err())
	// Output:
	// write with the current token: <nil>
	// stale write rejected: true
	// after release: leased: lease released
}

// Elect a leader: Campaign blocks until this process leads; the lease's token is the leader's epoch and its
// value tells observers who leads.
func ExampleClient_Campaign() {
	endpoints, stop := exampleCluster()
	defer stop()
	ctx := context.Background()

	c, err := client.New(client.Config{Endpoints: endpoints, Holder: "scheduler-a"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	lead, err := c.Campaign(ctx, "elections/scheduler", []byte("10.0.0.7:8080"), client.WithTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	// ... lead until <-lead.Done(); resign with lead.Release(ctx)
	leader, err := c.Leader(ctx, "elections/scheduler") // who leads now (Holder, Value, Token)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("leader %s at %s, epoch matches: %v\n", leader.Holder, leader.Value, leader.Token == lead.Token())

	// Do the leader's work until lead.Done() closes; resign when finished.
	_ = lead.Release(ctx)
	// Output:
	// leader scheduler-a at 10.0.0.7:8080, epoch matches: true
}

// exampleCluster starts a one-node leased in-process, so the examples run as they are.
func exampleCluster() ([]string, func()) {
	dir, err := os.MkdirTemp("", "leased-example")
	if err != nil {
		log.Fatal(err)
	}
	cl, _ := net.Listen("tcp", "127.0.0.1:0")
	pl, _ := net.Listen("tcp", "127.0.0.1:0")
	cfg := server.TestConfig()
	cfg.Name, cfg.DataDir = "n1", filepath.Join(dir, "n1")
	cfg.ClientAddr, cfg.PeerAddr = cl.Addr().String(), pl.Addr().String()
	cfg.InitialCluster = map[string]string{"n1": cfg.PeerAddr}
	s, err := server.New(cfg, server.Listeners{Client: cl, Peer: pl})
	if err != nil {
		log.Fatal(err)
	}
	s.Start()
	for deadline := time.Now().Add(10 * time.Second); !s.IsLeader(); {
		if time.Now().After(deadline) {
			log.Fatal("the example node did not elect itself")
		}
		time.Sleep(10 * time.Millisecond) // poll: a single node elects itself within an election timeout
	}
	return []string{s.ClientAddr()}, func() { _ = s.Close(); _ = os.RemoveAll(dir) }
}

// Run a leader loop whenever elected: OnStartedLeading's context ends with the term, and Run campaigns
// again after a loss and resigns when its context ends.
func ExampleClient_NewElector() {
	endpoints, stop := exampleCluster()
	defer stop()
	c, err := client.New(client.Config{Endpoints: endpoints, Holder: "scheduler-1"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	ctx, resign := context.WithCancel(context.Background())
	e, err := c.NewElector(client.ElectorConfig{
		Resource: "elections/scheduler",
		Value:    []byte("10.0.0.1:8080"), // what observers see as the leader
		TTL:      10 * time.Second,        // how long a dead leader blocks the next (default 10s)
		Callbacks: client.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context, lease *client.Lease) {
				// Lead until ctx ends. lease.Token() is this term's fencing token: pass it to every write.
				fmt.Println("leading; the term's token fences its writes:", lease.Token() > 0)
				resign() // here: resign at once, to end the example
				<-ctx.Done()
			},
			OnStoppedLeading: func() { fmt.Println("stopped leading") },
			// OnNewLeader: func(li client.LeaderInfo) { ... }, // every leader observed, in order
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("run:", e.Run(ctx)) // campaigns, leads, re-campaigns after a loss; returns when ctx ends
	// Output:
	// leading; the term's token fences its writes: true
	// stopped leading
	// run: context canceled
}

// A counting semaphore: at most two slots at once, each a lease with its own fencing token.
func ExampleWithLimit() {
	endpoints, stop := exampleCluster()
	defer stop()
	ctx := context.Background()
	c, err := client.New(client.Config{Endpoints: endpoints, Holder: "worker"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	a, _ := c.Acquire(ctx, "pools/api", client.WithLimit(2))
	b, _ := c.Acquire(ctx, "pools/api", client.WithLimit(2))
	_, err = c.Acquire(ctx, "pools/api", client.WithLimit(2))
	fmt.Println("third slot:", errors.Is(err, client.ErrHeld), "distinct tokens:", a.Token() != b.Token())
	_, err = c.Acquire(ctx, "pools/api", client.WithLimit(3))
	fmt.Println("another limit:", errors.Is(err, client.ErrInvalid))
	_ = a.Release(ctx)
	_ = b.Release(ctx)
	// Output:
	// third slot: true distinct tokens: true
	// another limit: true
}
