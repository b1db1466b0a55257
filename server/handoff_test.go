package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server/servertest"
)

// Handoffs (server/internal/waitq, "Handoff"): a release of a resource with queued waiters grants it to
// the head waiter in the release's own entry, so the waiter's token is the release's index.

type waited struct {
	resp *leasepb.AcquireResponse
	err  error
}

// queueWaiter starts a blocking acquire of req on node i and returns once it is queued (the node's queue
// for the resource is one longer). The answer arrives on the channel; ctx bounds the call.
func queueWaiter(t *testing.T, ctx context.Context, c *servertest.Cluster, i int, req *leasepb.AcquireRequest) <-chan waited {
	t.Helper()
	before := c.Node(i).QueueLen(req.GetResource())
	req.Wait = true
	out := make(chan waited, 1)
	go func() {
		resp, err := c.Leases(i).Acquire(ctx, req)
		out <- waited{resp, err}
	}()
	eventually(t, 10*time.Second, req.GetHolder()+" queued", func() bool { return c.Node(i).QueueLen(req.GetResource()) == before+1 })
	return out
}

func TestReleaseHandsTheResourceToTheHeadWaiterInItsOwnEntry(t *testing.T) {
	c := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	first, err := acquireRetrying(c, ctx, &leasepb.AcquireRequest{Resource: "q", Holder: "first", TtlMs: 60_000, RequestId: "first"})
	if err != nil {
		t.Fatal(err)
	}
	leader := c.WaitLeader()
	lc := c.Leases(leader)
	stream, err := lc.Watch(ctx, &leasepb.WatchRequest{Prefix: "q", FromIndex: first.GetLease().GetToken() + 1})
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"w1", "w2", "w3"}
	waiters := make([]<-chan waited, len(names))
	for i, name := range names {
		waiters[i] = queueWaiter(t, ctx, c, leader, &leasepb.AcquireRequest{Resource: "q", Holder: name, TtlMs: 60_000, RequestId: name})
	}
	token := first.GetLease().GetToken()
	for i, name := range names {
		rel, err := lc.Release(ctx, &leasepb.ReleaseRequest{Resource: "q", Token: token})
		if err != nil {
			t.Fatal(err)
		}
		got := <-waiters[i] // FIFO: the head waiter, and only it, is answered by this release
		if got.err != nil {
			t.Fatalf("%s: %v", name, got.err)
		}
		l := got.resp.GetLease()
		if l.GetHolder() != name || l.GetToken() != rel.GetReleasedIndex() || l.GetToken() <= token {
			t.Fatalf("%s got %v after the release at index %d of token %d: want its grant in that entry", name, l, rel.GetReleasedIndex(), token)
		}
		if l.GetRemainingMs() <= 0 {
			t.Fatalf("%s's grant has no remaining TTL: %v", name, l)
		}
		// Retry-safe: the same request id gets the same grant back.
		again, err := lc.Acquire(ctx, &leasepb.AcquireRequest{Resource: "q", Holder: name, TtlMs: 60_000, RequestId: name})
		if err != nil || !again.GetReplayed() || again.GetLease().GetToken() != l.GetToken() {
			t.Fatalf("%s retried: %v %v", name, again, err)
		}
		token = l.GetToken()
	}
	// Watchers see each handoff as a release and then a grant, both at the entry's index.
	events := recvEvents(t, stream, 2*len(names))
	for i := 0; i < len(events); i += 2 {
		r, g := events[i], events[i+1]
		if r.GetType() != leasepb.EventType_EVENT_TYPE_RELEASED || g.GetType() != leasepb.EventType_EVENT_TYPE_GRANTED ||
			r.GetIndex() != g.GetIndex() || g.GetLease().GetToken() != g.GetIndex() || g.GetLease().GetHolder() != names[i/2] {
			t.Fatalf("events %d and %d: %v, %v", i, i+1, r, g)
		}
	}
	// Every node applied the same handoffs.
	c.WaitSettled()
	for i := range c.Size() {
		got, err := c.Leases(i).Get(ctx, &leasepb.GetRequest{Resource: "q", Serializable: true})
		if err != nil || got.GetLease().GetHolder() != "w3" || got.GetLease().GetToken() != token {
			t.Fatalf("node %d: %v %v", i, got, err)
		}
	}
}

// A waiter cancelled after a release claimed it, before the entry applied: the entry still grants it the
// resource (the state machine cannot know the waiter left). That grant belongs to the gone waiter's holder
// and is handled like any grant whose answer was lost: a retry with the same request id gets it back, and
// otherwise it expires after its TTL, after which the next waiter is granted.
func TestHandoffToACancelledWaiterExpiresNormally(t *testing.T) {
	c := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	first, err := acquireRetrying(c, ctx, &leasepb.AcquireRequest{Resource: "q", Holder: "first", TtlMs: 60_000, RequestId: "first"})
	if err != nil {
		t.Fatal(err)
	}
	leader := c.WaitLeader()
	lc := c.Leases(leader)
	qctx, cancelQuitter := context.WithCancel(ctx)
	defer cancelQuitter()
	quitter := queueWaiter(t, qctx, c, leader, &leasepb.AcquireRequest{Resource: "q", Holder: "quitter", TtlMs: 1000, RequestId: "quit"})
	next := queueWaiter(t, ctx, c, leader, &leasepb.AcquireRequest{Resource: "q", Holder: "next", TtlMs: 60_000, RequestId: "next"})

	// Between the claim and the proposal, the quitter goes away.
	claimed := make(chan struct{})
	c.Node(leader).OnHandoffProposing(func() {
		close(claimed)
		cancelQuitter()
		eventually(t, 10*time.Second, "the quitter left", func() bool { return c.Node(leader).QueueLen("q") == 1 })
	})
	rel, err := lc.Release(ctx, &leasepb.ReleaseRequest{Resource: "q", Token: first.GetLease().GetToken()})
	c.Node(leader).OnHandoffProposing(nil)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-claimed:
	default:
		t.Fatal("the release carried no handoff")
	}
	if got := <-quitter; code(got.err) != codes.Canceled {
		t.Fatalf("cancelled waiter: %v %v", got.resp, got.err)
	}
	got, err := lc.Get(ctx, &leasepb.GetRequest{Resource: "q"})
	if err != nil || got.GetLease().GetHolder() != "quitter" || got.GetLease().GetToken() != rel.GetReleasedIndex() {
		t.Fatalf("after the release: %v %v, want the quitter's grant at index %d", got, err, rel.GetReleasedIndex())
	}
	// A retry of the quitter's intent gets the grant back.
	again, err := lc.Acquire(ctx, &leasepb.AcquireRequest{Resource: "q", Holder: "quitter", TtlMs: 1000, RequestId: "quit"})
	if err != nil || !again.GetReplayed() || again.GetLease().GetToken() != rel.GetReleasedIndex() {
		t.Fatalf("retried: %v %v", again, err)
	}
	// Nobody renews it: it expires, and the next waiter is granted after that.
	res := <-next
	if res.err != nil || res.resp.GetLease().GetHolder() != "next" || res.resp.GetLease().GetToken() <= rel.GetReleasedIndex() {
		t.Fatalf("next waiter: %v %v", res.resp, res.err)
	}
	end, err := lc.Release(ctx, &leasepb.ReleaseRequest{Resource: "q", Token: rel.GetReleasedIndex()})
	if code(err) != codes.NotFound || end != nil {
		t.Fatalf("release of the quitter's grant after it expired: %v %v", end, err)
	}
}

func TestHandoffKeepsTheLockDelayRules(t *testing.T) {
	c := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	t.Run("a release (voluntary) hands over at once", func(t *testing.T) {
		held, err := acquireRetrying(c, ctx, &leasepb.AcquireRequest{Resource: "ld/r", Holder: "a", TtlMs: 60_000, LockDelayMs: 60_000, RequestId: "a"})
		if err != nil {
			t.Fatal(err)
		}
		leader := c.WaitLeader()
		w := queueWaiter(t, ctx, c, leader, &leasepb.AcquireRequest{Resource: "ld/r", Holder: "b", TtlMs: 60_000, RequestId: "b"})
		rel, err := c.Leases(leader).Release(ctx, &leasepb.ReleaseRequest{Resource: "ld/r", Token: held.GetLease().GetToken()})
		if err != nil {
			t.Fatal(err)
		}
		if got := <-w; got.err != nil || got.resp.GetLease().GetToken() != rel.GetReleasedIndex() {
			t.Fatalf("waiter: %v %v", got.resp, got.err)
		}
	})
	t.Run("an expiry leaves the resource delayed", func(t *testing.T) {
		const ttl, delay = 800 * time.Millisecond, 1500 * time.Millisecond
		sent := time.Now()
		if _, err := acquireRetrying(c, ctx, &leasepb.AcquireRequest{Resource: "ld/e", Holder: "gone", TtlMs: ttl.Milliseconds(), LockDelayMs: delay.Milliseconds(), RequestId: "g"}); err != nil {
			t.Fatal(err)
		}
		leader := c.WaitLeader()
		w := queueWaiter(t, ctx, c, leader, &leasepb.AcquireRequest{Resource: "ld/e", Holder: "b", TtlMs: 60_000, RequestId: "b2"})
		got := <-w
		if got.err != nil || got.resp.GetLease().GetHolder() != "b" {
			t.Fatalf("waiter: %v %v", got.resp, got.err)
		}
		// A lower bound only: the lease lives at least its TTL from when it was sent, the delay at least
		// its length after that.
		if waited := time.Since(sent); waited < ttl+delay {
			t.Fatalf("granted %v after the expiring lease was sent, before its TTL and lock-delay (%v) could pass", waited, ttl+delay)
		}
	})
}

func TestHandoffOfASemaphoreSlot(t *testing.T) {
	c := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	slot := func(holder string) *leasepb.AcquireRequest {
		return &leasepb.AcquireRequest{Resource: "sem", Holder: holder, TtlMs: 60_000, RequestId: holder, Limit: 2}
	}
	a, err := acquireRetrying(c, ctx, slot("a"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := acquireRetrying(c, ctx, slot("b"))
	if err != nil {
		t.Fatal(err)
	}
	leader := c.WaitLeader()
	lc := c.Leases(leader)
	cw := queueWaiter(t, ctx, c, leader, slot("c"))
	dw := queueWaiter(t, ctx, c, leader, slot("d"))
	for _, step := range []struct {
		release *leasepb.AcquireResponse
		waiter  <-chan waited
		holder  string
	}{{a, cw, "c"}, {b, dw, "d"}} {
		rel, err := lc.Release(ctx, &leasepb.ReleaseRequest{Resource: "sem", Token: step.release.GetLease().GetToken()})
		if err != nil {
			t.Fatal(err)
		}
		got := <-step.waiter
		if got.err != nil || got.resp.GetLease().GetHolder() != step.holder || got.resp.GetLease().GetToken() != rel.GetReleasedIndex() {
			t.Fatalf("%s: %v %v, want its slot at index %d", step.holder, got.resp, got.err, rel.GetReleasedIndex())
		}
	}
	got, err := lc.Get(ctx, &leasepb.GetRequest{Resource: "sem"})
	if err != nil || len(got.GetSlots()) != 2 || fmt.Sprintf("%s %s", got.GetSlots()[0].GetHolder(), got.GetSlots()[1].GetHolder()) != "c d" {
		t.Fatalf("slots: %v %v", got, err)
	}
}
