package server_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest"
)

// identityRules let alice and bob read and lease anything, and ops administer.
var identityRules = []*leasepb.AclRule{
	{Identity: "ops", Prefix: "", Permissions: []leasepb.Permission{leasepb.Permission_PERMISSION_READ, leasepb.Permission_PERMISSION_LEASE, leasepb.Permission_PERMISSION_ADMIN}},
	{Identity: "alice", Prefix: "", Permissions: []leasepb.Permission{leasepb.Permission_PERMISSION_READ, leasepb.Permission_PERMISSION_LEASE}},
	{Identity: "bob", Prefix: "", Permissions: []leasepb.Permission{leasepb.Permission_PERMISSION_READ, leasepb.Permission_PERMISSION_LEASE}},
}

// leasesAs is a Leases client of node i presenting identity's certificate.
func leasesAs(t *testing.T, c *servertest.Cluster, ca *servertest.CA, i int, identity string) leasepb.LeasesClient {
	t.Helper()
	conn, err := grpc.NewClient(c.Endpoints()[i], grpc.WithTransportCredentials(credentials.NewTLS(ca.ClientTLS(identity))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return leasepb.NewLeasesClient(conn)
}

// acquireAs acquires on node i's client as identity, retrying while the cluster has no leader.
func acquireAs(ctx context.Context, cl leasepb.LeasesClient, resource, holder string) (*leasepb.AcquireResponse, error) {
	// One request id for every try, so that a retry of a grant whose answer was lost gets that grant.
	req := &leasepb.AcquireRequest{Resource: resource, Holder: holder, TtlMs: 60_000, RequestId: fmt.Sprintf("as/%d", retryingIDs.Add(1))}
	for {
		resp, err := cl.Acquire(ctx, req)
		if code(err) != codes.Unavailable || ctx.Err() != nil {
			return resp, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestHolderLimitIsPerIdentity: with client certificates, identity bob taking alice's holder label
// cannot use up her --max-leases-per-holder; bob is held to the limit under that label himself.
func TestHolderLimitIsPerIdentity(t *testing.T) {
	ca := servertest.NewCA(t)
	c := servertest.StartWithACL(t, 1, ca, "ops", identityRules, func(cfg *server.Config) { cfg.Limits.MaxLeasesPerHolder = 2 })
	ctx := ctxT(t)
	alice, bob := leasesAs(t, c, ca, 0, "alice"), leasesAs(t, c, ca, 0, "bob")
	for i := range 2 {
		if _, err := acquireAs(ctx, bob, fmt.Sprintf("bob/%d", i), "alice-worker"); err != nil {
			t.Fatalf("bob's lease %d under alice's label: %v", i, err)
		}
	}
	_, err := acquireAs(ctx, bob, "bob/2", "alice-worker")
	if limitFlag(err) != "--max-leases-per-holder" {
		t.Fatalf("bob's third lease under the label at limit 2: %v, want ResourceExhausted naming --max-leases-per-holder", err)
	}
	for i := range 2 {
		if _, err := acquireAs(ctx, alice, fmt.Sprintf("alice/%d", i), "alice-worker"); err != nil {
			t.Fatalf("alice's lease %d under her own label after bob filled it: %v", i, err)
		}
	}
}

// TestMaxLeasesPerIdentity: an identity at --max-leases-per-identity is refused under any holder label,
// through the leader and a follower, with ResourceExhausted naming the flag, while another identity
// still acquires; a release makes room again.
func TestMaxLeasesPerIdentity(t *testing.T) {
	const limit = 3
	ca := servertest.NewCA(t)
	c := servertest.StartWithACL(t, 3, ca, "ops", identityRules, func(cfg *server.Config) { cfg.Limits.MaxLeasesPerIdentity = limit })
	ctx := ctxT(t)
	li, fi := c.WaitLeader(), c.Follower()
	var first *leasepb.Lease
	for i := range limit {
		resp, err := acquireAs(ctx, leasesAs(t, c, ca, li, "bob"), fmt.Sprintf("bob/%d", i), fmt.Sprintf("holder-%d", i))
		if err != nil {
			t.Fatalf("bob's lease %d: %v", i, err)
		}
		if i == 0 {
			first = resp.GetLease()
		}
	}
	for _, node := range []int{li, fi} {
		_, err := acquireAs(ctx, leasesAs(t, c, ca, node, "bob"), "bob/extra", "another-label")
		if limitFlag(err) != "--max-leases-per-identity" || !strings.Contains(status.Convert(err).Message(), `"bob"`) {
			t.Fatalf("bob past his limit (node %d): %v, want ResourceExhausted naming --max-leases-per-identity and bob", node, err)
		}
	}
	for _, node := range []int{li, fi} {
		if _, err := acquireAs(ctx, leasesAs(t, c, ca, node, "alice"), fmt.Sprintf("alice/%d", node), "holder-0"); err != nil {
			t.Fatalf("alice while bob is at his limit (node %d): %v", node, err)
		}
	}
	bob := leasesAs(t, c, ca, li, "bob")
	for {
		// Retried while the node has no leader; a retry of a release that was applied answers as one.
		_, err := bob.Release(ctx, &leasepb.ReleaseRequest{Resource: first.GetResource(), Token: first.GetToken()})
		if err == nil {
			break
		}
		if code(err) != codes.Unavailable || ctx.Err() != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := acquireAs(ctx, bob, "bob/extra", "another-label"); err != nil {
		t.Fatalf("bob after a release: %v", err)
	}
}

// TestMaxWatchersPerIdentity: an identity at --max-watchers-per-identity gets ResourceExhausted naming
// the flag for one more Watch, while another identity still watches.
func TestMaxWatchersPerIdentity(t *testing.T) {
	ca := servertest.NewCA(t)
	c := servertest.StartWithACL(t, 1, ca, "ops", identityRules, func(cfg *server.Config) { cfg.Limits.MaxWatchersPerIdentity = 2 })
	ctx := ctxT(t)
	alice, bob := leasesAs(t, c, ca, 0, "alice"), leasesAs(t, c, ca, 0, "bob")
	var streams []grpc.ServerStreamingClient[leasepb.WatchResponse]
	for range 2 {
		s, err := bob.Watch(ctx, &leasepb.WatchRequest{Prefix: "w/"})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, s)
	}
	// Both are subscribed once each has seen an event.
	w1, err := acquireAs(ctx, alice, "w/1", "h")
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range streams {
		if _, err := s.Recv(); err != nil {
			t.Fatalf("bob's watch %d: %v", i, err)
		}
	}
	ectx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	extra, err := bob.Watch(ectx, &leasepb.WatchRequest{Prefix: "w/"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := extra.Recv(); limitFlag(err) != "--max-watchers-per-identity" {
		t.Fatalf("bob's third watch at limit 2: %v, want ResourceExhausted naming --max-watchers-per-identity", err)
	}
	theirs, err := alice.Watch(ctx, &leasepb.WatchRequest{Prefix: "w/", FromIndex: w1.GetLease().GetToken()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := theirs.Recv(); err != nil {
		t.Fatalf("alice's watch while bob is at his limit: %v", err)
	}
}

// TestMaxWaitersPerIdentity: an identity at --max-waiters-per-identity gets ResourceExhausted naming
// the flag for one more blocking acquire, while another identity still queues.
func TestMaxWaitersPerIdentity(t *testing.T) {
	ca := servertest.NewCA(t)
	c := servertest.StartWithACL(t, 1, ca, "ops", identityRules, func(cfg *server.Config) { cfg.Limits.MaxWaitersPerIdentity = 1 })
	ctx := ctxT(t)
	ops, alice, bob := leasesAs(t, c, ca, 0, "ops"), leasesAs(t, c, ca, 0, "alice"), leasesAs(t, c, ca, 0, "bob")
	for _, r := range []string{"q/1", "q/2"} {
		if _, err := acquireAs(ctx, ops, r, "owner"); err != nil {
			t.Fatal(err)
		}
	}
	waitCtx, stopWaiting := context.WithCancel(ctx)
	waited := make(chan error, 1)
	go func() {
		_, err := bob.Acquire(waitCtx, &leasepb.AcquireRequest{Resource: "q/1", Holder: "w", TtlMs: 60_000, Wait: true})
		waited <- err
	}()
	defer stopWaiting()
	// Probe only once the first waiter is queued: a probe queued before it would hold bob's one slot and
	// turn the first waiter away.
	eventually(t, 10*time.Second, "bob's first waiter to queue", func() bool {
		select {
		case err := <-waited:
			t.Fatalf("bob's first waiter ended before queueing: %v", err)
		default:
		}
		return c.Node(0).Waiters() == 1
	})
	_, err := bob.Acquire(ctx, &leasepb.AcquireRequest{Resource: "q/2", Holder: "w", TtlMs: 60_000, Wait: true, WaitMs: 100})
	if limitFlag(err) != "--max-waiters-per-identity" {
		t.Fatalf("bob's second blocking acquire at limit 1: %v, want ResourceExhausted naming --max-waiters-per-identity", err)
	}
	_, err = alice.Acquire(ctx, &leasepb.AcquireRequest{Resource: "q/2", Holder: "w", TtlMs: 60_000, Wait: true, WaitMs: 100})
	if code(err) != codes.FailedPrecondition || heldDetail(err) == nil {
		t.Fatalf("alice's blocking acquire while bob is at his limit: %v, want it queued and answered held", err)
	}
	select {
	case err := <-waited:
		t.Fatalf("bob's first waiter ended early: %v", err)
	default:
	}
	stopWaiting()
	if err := <-waited; !errors.Is(err, context.Canceled) && code(err) != codes.Canceled {
		t.Fatalf("bob's first waiter: %v, want canceled", err)
	}
	// Its slot is free again once the node has seen the cancellation.
	eventually(t, 10*time.Second, "bob queues again after his waiter left", func() bool {
		_, err := bob.Acquire(ctx, &leasepb.AcquireRequest{Resource: "q/2", Holder: "w", TtlMs: 60_000, Wait: true, WaitMs: 100})
		return code(err) == codes.FailedPrecondition
	})
}

// TestQuotaBytesPerIdentity: an identity whose leases reach --quota-bytes-per-identity is refused new
// grants with ResourceExhausted naming the flag, while another identity still acquires, and the first
// may still renew and release; a release makes room.
func TestQuotaBytesPerIdentity(t *testing.T) {
	ca := servertest.NewCA(t)
	// Each lease below counts 128 bytes of overhead, its names and a 100-byte value: about 240 bytes.
	c := servertest.StartWithACL(t, 1, ca, "ops", identityRules, func(cfg *server.Config) { cfg.Limits.QuotaBytesPerIdentity = 1000 })
	ctx := ctxT(t)
	alice, bob := leasesAs(t, c, ca, 0, "alice"), leasesAs(t, c, ca, 0, "bob")
	value := []byte(strings.Repeat("v", 100))
	var granted []*leasepb.Lease
	var refusal error
	for i := 0; i < 10 && refusal == nil; i++ {
		resp, err := bob.Acquire(ctx, &leasepb.AcquireRequest{Resource: fmt.Sprintf("b/%d", i), Holder: fmt.Sprintf("h%d", i), TtlMs: 60_000, Value: value})
		switch {
		case limitFlag(err) == "--quota-bytes-per-identity":
			refusal = err
		case err != nil:
			t.Fatalf("bob's lease %d: %v", i, err)
		default:
			granted = append(granted, resp.GetLease())
		}
	}
	if refusal == nil || len(granted) < 3 || len(granted) > 5 || !strings.Contains(status.Convert(refusal).Message(), `"bob"`) {
		t.Fatalf("bob took %d leases of about 240 bytes under a quota of 1000, refusal %v; want 4 or 5 and ResourceExhausted naming the flag and bob", len(granted), refusal)
	}
	if _, err := alice.Acquire(ctx, &leasepb.AcquireRequest{Resource: "a/0", Holder: "h0", TtlMs: 60_000, Value: value}); err != nil {
		t.Fatalf("alice while bob is at his quota: %v", err)
	}
	if _, err := bob.Renew(ctx, &leasepb.RenewRequest{Resource: granted[0].GetResource(), Token: granted[0].GetToken()}); err != nil {
		t.Fatalf("bob's renewal at his quota: %v", err)
	}
	if _, err := bob.Release(ctx, &leasepb.ReleaseRequest{Resource: granted[0].GetResource(), Token: granted[0].GetToken()}); err != nil {
		t.Fatalf("bob's release at his quota: %v", err)
	}
	if _, err := bob.Acquire(ctx, &leasepb.AcquireRequest{Resource: "b/again", Holder: "h0", TtlMs: 60_000, Value: value}); err != nil {
		t.Fatalf("bob after a release made room: %v", err)
	}
}
