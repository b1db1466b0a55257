package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc/codes"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server/servertest"
)

func TestGrantRenewReleaseOnThreeNodes(t *testing.T) {
	c := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	f := c.Follower()

	// A write that reaches a follower is forwarded to the leader.
	got, err := c.Leases(f).Acquire(ctx, &leasepb.AcquireRequest{Resource: "db/primary", Holder: "alice", TtlMs: 5000, RequestId: "r1", Value: []byte("10.0.0.1")})
	if err != nil {
		t.Fatalf("acquire via follower: %v", err)
	}
	tok := got.GetLease().GetToken()
	if tok == 0 || got.GetHeader().GetLeaderId() == 0 {
		t.Fatalf("acquire = %v", got)
	}
	// Every node answers a linearizable Get with the grant.
	for i := range c.Size() {
		g, err := c.Leases(i).Get(ctx, &leasepb.GetRequest{Resource: "db/primary"})
		if err != nil || g.GetLease().GetToken() != tok || g.GetLease().GetHolder() != "alice" || string(g.GetLease().GetValue()) != "10.0.0.1" {
			t.Fatalf("get on n%d = %v, %v", i+1, g, err)
		}
	}
	// Someone else is refused with the holder in the details.
	_, err = c.Leases(f).Acquire(ctx, &leasepb.AcquireRequest{Resource: "db/primary", Holder: "bob", TtlMs: 5000, RequestId: "b1"})
	if code(err) != codes.FailedPrecondition {
		t.Fatalf("second holder: %v, want FailedPrecondition", err)
	}
	if held := heldDetail(err); held.GetHolder() != "alice" || held.GetToken() != tok {
		t.Fatalf("held details = %v", held)
	}
	// Renew through a follower, then release; a second release (a retry whose answer was lost) is OK,
	// already released.
	r, err := c.Leases(f).Renew(ctx, &leasepb.RenewRequest{Resource: "db/primary", Token: tok})
	if err != nil || r.GetTtlMs() != 5000 {
		t.Fatalf("renew = %v, %v", r, err)
	}
	rel, err := c.Leases(f).Release(ctx, &leasepb.ReleaseRequest{Resource: "db/primary", Token: tok})
	if err != nil || rel.GetAlreadyReleased() || rel.GetReleasedIndex() <= tok {
		t.Fatalf("release: %v, %v", rel, err)
	}
	again, err := c.Leases(f).Release(ctx, &leasepb.ReleaseRequest{Resource: "db/primary", Token: tok})
	if err != nil || !again.GetAlreadyReleased() || again.GetReleasedIndex() != rel.GetReleasedIndex() {
		t.Fatalf("second release: %v, %v; want OK, already released at %d", again, err, rel.GetReleasedIndex())
	}
	if _, err := c.Leases(f).Renew(ctx, &leasepb.RenewRequest{Resource: "db/primary", Token: tok}); code(err) != codes.NotFound {
		t.Fatalf("renew after release: %v, want NotFound", err)
	}
	if _, err := c.Leases(0).Get(ctx, &leasepb.GetRequest{Resource: "db/primary"}); code(err) != codes.NotFound {
		t.Fatalf("get after release: %v, want NotFound", err)
	}
	reacq, err := c.Leases(0).Acquire(ctx, &leasepb.AcquireRequest{Resource: "db/primary", Holder: "bob", TtlMs: 5000, RequestId: "b2"})
	if err != nil || reacq.GetLease().GetToken() <= tok {
		t.Fatalf("re-acquire = %v, %v; want a token above %d", reacq, err, tok)
	}
}

func TestAcquireRetryWithSameRequestIDReturnsSameToken(t *testing.T) {
	c := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	req := &leasepb.AcquireRequest{Resource: "jobs/cron", Holder: "host-1:42", TtlMs: 5000, RequestId: "idem-1"}
	first, err := c.Leases(0).Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	for i := range c.Size() {
		retry, err := c.Leases(i).Acquire(ctx, req)
		if err != nil || retry.GetLease().GetToken() != first.GetLease().GetToken() || !retry.GetReplayed() {
			t.Fatalf("retry via n%d = %v, %v", i+1, retry, err)
		}
	}
}

func TestExpiredLeaseIsRegrantedWithLargerToken(t *testing.T) {
	c := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	first, err := c.Leases(0).Acquire(ctx, &leasepb.AcquireRequest{Resource: "r", Holder: "dead", TtlMs: 800, RequestId: "a"})
	if err != nil {
		t.Fatal(err)
	}
	// Nobody renews: the leader expires it; a watcher sees the expiry.
	eventually(t, 5*time.Second, "expiry", func() bool {
		_, err := c.Leases(1).Get(ctx, &leasepb.GetRequest{Resource: "r"})
		return code(err) == codes.NotFound
	})
	next, err := c.Leases(2).Acquire(ctx, &leasepb.AcquireRequest{Resource: "r", Holder: "alive", TtlMs: 5000, RequestId: "b"})
	if err != nil || next.GetLease().GetToken() <= first.GetLease().GetToken() {
		t.Fatalf("re-grant = %v, %v", next, err)
	}
	// A late renewal of the expired token is refused.
	if _, err := c.Leases(0).Renew(ctx, &leasepb.RenewRequest{Resource: "r", Token: first.GetLease().GetToken()}); code(err) != codes.NotFound {
		t.Fatalf("late renewal: %v", err)
	}
}

func TestKeepAliveKeepsLeasesPastTheirTTL(t *testing.T) {
	c := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	f := c.Follower()
	var refs []*leasepb.LeaseRef
	for _, r := range []string{"a", "b", "c"} {
		got, err := c.Leases(f).Acquire(ctx, &leasepb.AcquireRequest{Resource: r, Holder: "h", TtlMs: 800, RequestId: r})
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, &leasepb.LeaseRef{Resource: r, Token: got.GetLease().GetToken()})
	}
	stream, err := c.Leases(f).KeepAlive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A renewal round answers Unavailable when no quorum confirmed the leader within an election timeout
	// (100 ms here, which a loaded machine under the race detector can miss) and ends the stream; a
	// client opens another one and renews again, as the SDK does. A lease lost meanwhile still fails.
	reopens := 0
	start := time.Now()
	for seq := uint64(1); time.Since(start) < 3200*time.Millisecond; seq++ { // four TTLs
		if err := stream.Send(&leasepb.KeepAliveRequest{Seq: seq, Leases: refs}); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if code(err) == codes.Unavailable && reopens < 3 {
			reopens++
			t.Logf("renewal round %d: %v; opening another stream", seq, err)
			if stream, err = c.Leases(f).KeepAlive(ctx); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetSeq() != seq || len(resp.GetResults()) != 3 {
			t.Fatalf("keepalive response %v", resp)
		}
		for _, r := range resp.GetResults() {
			if r.GetGone() || r.GetTtlMs() != 800 {
				t.Fatalf("lease lost while renewed: %v", r)
			}
		}
		time.Sleep(100 * time.Millisecond) // the renewal interval, not a wait for a condition
	}
	// A released lease reports gone on the stream.
	if _, err := c.Leases(0).Release(ctx, &leasepb.ReleaseRequest{Resource: "b", Token: refs[1].Token}); err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&leasepb.KeepAliveRequest{Seq: 99, Leases: refs}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil || !resp.GetResults()[1].GetGone() || resp.GetResults()[0].GetGone() {
		t.Fatalf("after release: %v, %v", resp, err)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("stream end: %v", err)
	}
}

func TestBadInputGetsDocumentedCodeAndChangesNothing(t *testing.T) {
	c := servertest.Start(t, 1, nil)
	ctx := ctxT(t)
	cl := c.Leases(0)
	long := string(make([]byte, 300))
	bad := []*leasepb.AcquireRequest{
		{Resource: "", Holder: "h", TtlMs: 1000},
		{Resource: "a b", Holder: "h", TtlMs: 1000},
		{Resource: "/a", Holder: "h", TtlMs: 1000},
		{Resource: "a//b", Holder: "h", TtlMs: 1000},
		{Resource: long, Holder: "h", TtlMs: 1000},
		{Resource: "r", Holder: "", TtlMs: 1000},
		{Resource: "r", Holder: "h h", TtlMs: 1000},
		{Resource: "r", Holder: "h", TtlMs: 10},
		{Resource: "r", Holder: "h", TtlMs: 10_000_000},
		{Resource: "r", Holder: "h", TtlMs: 1000, Value: make([]byte, 5000)},
		{Resource: "r", Holder: "h", TtlMs: 1000, LockDelayMs: -1},
		{Resource: "r", Holder: "h", TtlMs: 1000, RequestId: string(make([]byte, 100))},
	}
	before := c.Node(0).AppliedIndex()
	for _, req := range bad {
		if _, err := cl.Acquire(ctx, req); code(err) != codes.InvalidArgument {
			t.Errorf("acquire %v: %v, want InvalidArgument", req, err)
		}
	}
	if _, err := cl.Renew(ctx, &leasepb.RenewRequest{Resource: "r", Token: 0}); code(err) != codes.InvalidArgument {
		t.Errorf("renew token 0: %v", err)
	}
	if _, err := cl.List(ctx, &leasepb.ListRequest{Limit: 5000}); code(err) != codes.InvalidArgument {
		t.Errorf("list limit: %v", err)
	}
	if after := c.Node(0).AppliedIndex(); after != before {
		t.Fatalf("bad input moved the applied index from %d to %d", before, after)
	}
}

// TestIdleLeasesAreRenewedWithOneLogEntry: leases gone idle (checkpointed) need a durable renewal; one
// KeepAlive message for many of them must cost one log entry, not one per lease (which would stall a
// client holding thousands of leases past their TTL).
func TestIdleLeasesAreRenewedWithOneLogEntry(t *testing.T) {
	c := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	leader := c.WaitLeader()
	var refs []*leasepb.LeaseRef
	for i := range 50 {
		resp, err := c.Leases(leader).Acquire(ctx, &leasepb.AcquireRequest{Resource: fmt.Sprintf("idle/%d", i), Holder: "h", TtlMs: 30_000})
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, &leasepb.LeaseRef{Resource: resp.GetLease().GetResource(), Token: resp.GetLease().GetToken()})
	}
	// Wait until a checkpoint has marked them idle: the applied index moves by the checkpoint entry and
	// then stays still.
	node := c.Node(leader)
	before := node.AppliedIndex()
	eventually(t, 5*time.Second, "a checkpoint", func() bool { return node.AppliedIndex() > before })
	stable := node.AppliedIndex()
	stream, err := c.Leases(leader).KeepAlive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&leasepb.KeepAliveRequest{Seq: 1, Leases: refs}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range resp.GetResults() {
		if r.GetGone() || r.GetTtlMs() != 30_000 {
			t.Fatalf("renewal of an idle lease: %v", r)
		}
	}
	if used := node.AppliedIndex() - stable; used > 5 {
		t.Fatalf("renewing 50 idle leases used %d log entries", used)
	}
	_ = stream.CloseSend()
}

// List by holder and prefix filters inside the scan: a holder with many leases outside the prefix still
// lists every match, and small pages return each match exactly once.
func TestListByHolderAndPrefixFindsEveryMatch(t *testing.T) {
	c := servertest.Start(t, 3, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c.WaitLeader()
	resources := []string{"b/0", "b/1", "b/2"}
	for i := range 1100 {
		resources = append(resources, fmt.Sprintf("a/%04d", i))
	}
	// 1,103 grants, sixteen at a time (one at a time takes too long on a loaded two-core machine).
	var g errgroup.Group
	g.SetLimit(16)
	for _, r := range resources {
		g.Go(func() error {
			_, err := acquireRetrying(c, ctx, &leasepb.AcquireRequest{Resource: r, Holder: "h", TtlMs: 600_000, RequestId: r})
			return err
		})
	}
	g.Go(func() error {
		_, err := acquireRetrying(c, ctx, &leasepb.AcquireRequest{Resource: "b/other", Holder: "someone-else", TtlMs: 600_000, RequestId: "o"})
		return err
	})
	if err := g.Wait(); err != nil {
		t.Fatalf("acquire: %v", err)
	}

	list := func(prefix string, limit uint32) []string {
		t.Helper()
		var got []string
		req := &leasepb.ListRequest{Holder: "h", Prefix: prefix, Limit: limit}
		for pages := 0; ; pages++ {
			if pages > 200 {
				t.Fatalf("prefix %q: paging does not end", prefix)
			}
			resp, err := listRetrying(c, ctx, req)
			if err != nil {
				t.Fatalf("list: %v", err)
			}
			for _, lease := range resp.GetLeases() {
				got = append(got, lease.GetResource())
			}
			if resp.GetNextPageToken() == "" {
				return got
			}
			req.PageToken = resp.GetNextPageToken()
		}
	}
	if got := list("b/", 0); fmt.Sprint(got) != "[b/0 b/1 b/2]" {
		t.Fatalf("holder h under b/ = %v", got)
	}
	if got := list("b/", 10); len(got) != 3 {
		t.Fatalf("holder h under b/ in pages of 10 = %v", got)
	}
	got := list("", 10)
	seen := map[string]bool{}
	for _, r := range got {
		if seen[r] {
			t.Fatalf("%s listed twice", r)
		}
		seen[r] = true
	}
	if len(got) != 1103 || seen["b/other"] {
		t.Fatalf("holder h in pages of 10: %d leases, want 1103", len(got))
	}
}
