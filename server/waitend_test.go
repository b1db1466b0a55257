package server_test

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server/servertest"
)

// A blocking acquire whose wait_ms runs out while the resource is held is answered as a try-lock: held,
// naming the holder, and it leaves the queue. Sent through a follower (forwarded). A wait_ms that a release beats is a grant.
func TestWaitThatRunsOutIsAnsweredWithTheHolder(t *testing.T) {
	c, reg := startWithRegistries(t, 3, nil)
	ctx := ctxT(t)
	l, f := c.WaitLeader(), c.Follower()
	proposed := func() float64 { return appliedProposals(t, reg(l)) }
	alice, err := c.Leases(l).Acquire(ctx, &leasepb.AcquireRequest{Resource: "r", Holder: "alice", TtlMs: 60_000})
	if err != nil {
		t.Fatal(err)
	}

	before, start := proposed(), time.Now()
	const wait = 300 * time.Millisecond
	_, err = c.Leases(f).Acquire(ctx, &leasepb.AcquireRequest{Resource: "r", Holder: "bob", TtlMs: 60_000,
		RequestId: "b1", Attempt: 1, Wait: true, WaitMs: wait.Milliseconds()})
	waited := time.Since(start)
	held := heldDetail(err)
	if status.Code(err) != codes.FailedPrecondition || held == nil {
		t.Fatalf("a wait that ran out: %v, want FAILED_PRECONDITION with LeaseHeld", err)
	}
	if held.GetHolder() != "alice" || held.GetToken() != alice.GetLease().GetToken() {
		t.Errorf("held by %v, want alice with token %d", held, alice.GetLease().GetToken())
	}
	if waited < wait {
		t.Errorf("answered after %v, before its wait of %v ended", waited, wait)
	}
	if n := proposed() - before; n > 1 {
		t.Errorf("the wait and its end proposed %v entries, want at most the try-lock of its end", n)
	}
	if n := c.Node(l).Waiters(); n != 0 {
		t.Errorf("the leader still queues %d waiters after the wait ended", n)
	}

	granted := make(chan error, 1)
	go func() {
		_, err := c.Leases(f).Acquire(ctx, &leasepb.AcquireRequest{Resource: "r", Holder: "carol", TtlMs: 60_000,
			RequestId: "c1", Attempt: 1, Wait: true, WaitMs: time.Minute.Milliseconds()})
		granted <- err
	}()
	eventually(t, 10*time.Second, "carol queued", func() bool { return c.Node(l).Waiters() == 1 })
	if _, err := c.Leases(l).Release(ctx, &leasepb.ReleaseRequest{Resource: "r", Token: alice.GetLease().GetToken()}); err != nil {
		t.Fatal(err)
	}
	if err := <-granted; err != nil {
		t.Fatalf("a wait a release beat: %v, want the grant", err)
	}
}

// A waiter whose wait ends while a release carries its grant (claimed, the entry not yet proposed) stays
// for that entry's outcome and is granted: a "held" then would be a lie the log contradicts.
func TestWaitEndingWhileAReleaseCarriesItIsGranted(t *testing.T) {
	c := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	l := c.WaitLeader()
	lc := c.Leases(l)
	a, err := lc.Acquire(ctx, &leasepb.AcquireRequest{Resource: "r", Holder: "a", TtlMs: 60_000})
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		resp *leasepb.AcquireResponse
		err  error
	}
	waited := make(chan result, 1)
	go func() {
		resp, err := lc.Acquire(ctx, &leasepb.AcquireRequest{Resource: "r", Holder: "w", TtlMs: 60_000,
			RequestId: "w1", Attempt: 1, Wait: true, WaitMs: 1500})
		waited <- result{resp, err}
	}()
	eventually(t, 10*time.Second, "w queued", func() bool { return c.Node(l).QueueLen("r") == 1 })
	queued := time.Now()
	c.Node(l).OnHandoffProposing(func() {
		// Hold the release's entry until w's wait of 1.5 s has run out, and a while more. (The wait is long
		// so that the release below surely claims w before it runs out, however loaded the machine.)
		eventually(t, 10*time.Second, "w's wait to run out", func() bool { return time.Since(queued) > 2*time.Second })
		select {
		case r := <-waited:
			t.Errorf("w was answered while a release carried its grant: %v, %v", r.resp, r.err)
			waited <- r
		default:
		}
	})
	rel, err := lc.Release(ctx, &leasepb.ReleaseRequest{Resource: "r", Token: a.GetLease().GetToken()})
	c.Node(l).OnHandoffProposing(nil)
	if err != nil {
		t.Fatal(err)
	}
	r := <-waited
	if r.err != nil || r.resp.GetLease().GetHolder() != "w" || r.resp.GetLease().GetToken() != rel.GetReleasedIndex() {
		t.Fatalf("w: %v, %v; want the grant the release carried (token %d)", r.resp, r.err, rel.GetReleasedIndex())
	}
}
