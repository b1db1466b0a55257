package server_test

import (
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server/servertest"
)

// TestFreshRequestRefusedFromARead: the first attempt of a fresh request id that finds the resource held
// is refused without a log entry (no proposal on the leader), with the same answer an entry would give;
// every other acquire is proposed: a later attempt, a request id not marked fresh, a free resource, and a
// waiting acquire (which queues instead).
func TestFreshRequestRefusedFromARead(t *testing.T) {
	c, reg := startWithRegistries(t, 3, nil)
	ctx := ctxT(t)
	l := c.WaitLeader()
	leases := c.Leases(l)
	proposed := func() float64 { return appliedProposals(t, reg(l)) }
	holder, err := leases.Acquire(ctx, &leasepb.AcquireRequest{Resource: "r", Holder: "a", TtlMs: 60_000, RequestId: "qa", Attempt: 1, FreshRequestId: true})
	if err != nil {
		t.Fatalf("fresh acquire of a free resource: %v", err)
	}

	acquire := func(req *leasepb.AcquireRequest) (*leasepb.LeaseHeld, float64) {
		t.Helper()
		before := proposed()
		_, err := leases.Acquire(ctx, req)
		held := heldDetail(err)
		if status.Code(err) != codes.FailedPrecondition || held == nil {
			t.Fatalf("acquire %v of the held resource: %v, want FAILED_PRECONDITION with LeaseHeld", req, err)
		}
		return held, proposed() - before
	}
	fresh := &leasepb.AcquireRequest{Resource: "r", Holder: "b", TtlMs: 60_000, RequestId: "qb", Attempt: 1, FreshRequestId: true}
	held, entries := acquire(fresh)
	if entries != 0 {
		t.Errorf("a fresh request id's first attempt refused as held proposed %v entries, want none", entries)
	}
	if held.GetHolder() != "a" || held.GetToken() != holder.GetLease().GetToken() || held.GetRemainingMs() <= 0 {
		t.Errorf("held answer %v, want holder a, token %d and a remaining TTL", held, holder.GetLease().GetToken())
	}
	for _, req := range []*leasepb.AcquireRequest{
		{Resource: "r", Holder: "b", TtlMs: 60_000, RequestId: "qb", Attempt: 2},                       // the next attempt
		{Resource: "r", Holder: "b", TtlMs: 60_000, RequestId: "qc", Attempt: 1},                       // not marked fresh
		{Resource: "r", Holder: "b", TtlMs: 60_000, RequestId: "qd", Attempt: 2, FreshRequestId: true}, // fresh only at attempt 1
	} {
		if _, entries := acquire(req); entries != 1 {
			t.Errorf("acquire %v proposed %v entries, want 1", req, entries)
		}
	}

	// A waiting acquire queues: it is granted once the holder releases.
	granted := make(chan error, 1)
	go func() {
		_, err := leases.Acquire(ctx, &leasepb.AcquireRequest{Resource: "r", Holder: "w", TtlMs: 60_000, RequestId: "qw", Attempt: 1, FreshRequestId: true, Wait: true})
		granted <- err
	}()
	if _, err := leases.Release(ctx, &leasepb.ReleaseRequest{Resource: "r", Token: holder.GetLease().GetToken()}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-granted:
		if err != nil {
			t.Fatalf("the waiting fresh acquire: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the waiting fresh acquire was not granted")
	}
}

// TestFreshRequestRefusalComesFromTheLeader: a follower's state may lag, so the refusal is read
// linearizably on the leader, never from a stale copy: right after a release, a fresh acquire through a
// follower (forwarded) is granted.
func TestFreshRequestRefusalComesFromTheLeader(t *testing.T) {
	c := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	f := c.Follower()
	for i := range 20 {
		a, err := c.Leases(f).Acquire(ctx, &leasepb.AcquireRequest{Resource: "r", Holder: "a", TtlMs: 60_000})
		if err != nil {
			t.Fatalf("round %d: acquire: %v", i, err)
		}
		if _, err := c.Leases(c.WaitLeader()).Release(ctx, &leasepb.ReleaseRequest{Resource: "r", Token: a.GetLease().GetToken()}); err != nil {
			t.Fatalf("round %d: release: %v", i, err)
		}
		b, err := c.Leases(f).Acquire(ctx, &leasepb.AcquireRequest{Resource: "r", Holder: "b", TtlMs: 60_000, RequestId: fmt.Sprintf("q%d", i), Attempt: 1, FreshRequestId: true})
		if err != nil {
			t.Fatalf("round %d: a fresh acquire after the release: %v", i, err)
		}
		if _, err := c.Leases(f).Release(ctx, &leasepb.ReleaseRequest{Resource: "r", Token: b.GetLease().GetToken()}); err != nil {
			t.Fatalf("round %d: release b: %v", i, err)
		}
	}
}
