package server_test

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest"
)

func TestListPaginatesAndValidateTokenAnswers(t *testing.T) {
	c := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	var toks []uint64
	for i := range 7 {
		resp, err := acquireRetrying(c, ctx, &leasepb.AcquireRequest{Resource: fmt.Sprintf("l/%d", i), Holder: fmt.Sprintf("h%d", i%2), TtlMs: 60_000, RequestId: fmt.Sprint(i)})
		if err != nil {
			t.Fatal(err)
		}
		toks = append(toks, resp.GetLease().GetToken())
	}
	var got []string
	page := ""
	for range 10 {
		resp, err := c.Leases(1).List(ctx, &leasepb.ListRequest{Prefix: "l/", Limit: 3, PageToken: page})
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range resp.GetLeases() {
			got = append(got, l.GetResource())
		}
		if page = resp.GetNextPageToken(); page == "" {
			break
		}
	}
	if fmt.Sprint(got) != "[l/0 l/1 l/2 l/3 l/4 l/5 l/6]" {
		t.Fatalf("paged list = %v", got)
	}
	byHolder, err := c.Leases(2).List(ctx, &leasepb.ListRequest{Holder: "h1"})
	if err != nil || len(byHolder.GetLeases()) != 3 {
		t.Fatalf("leases of h1 = %v, %v", byHolder, err)
	}
	v, err := c.Leases(2).ValidateToken(ctx, &leasepb.ValidateTokenRequest{Resource: "l/3", Token: toks[3]})
	if err != nil || !v.GetCurrent() || v.GetCurrentToken() != toks[3] {
		t.Fatalf("validate current = %v, %v", v, err)
	}
	v, err = c.Leases(0).ValidateToken(ctx, &leasepb.ValidateTokenRequest{Resource: "l/3", Token: toks[2]})
	if err != nil || v.GetCurrent() || v.GetCurrentToken() != toks[3] {
		t.Fatalf("validate stale = %v, %v", v, err)
	}
}

func TestLockDelayThroughTheAPI(t *testing.T) {
	c := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	if _, err := acquireRetrying(c, ctx, &leasepb.AcquireRequest{Resource: "ld", Holder: "gone", TtlMs: 800, LockDelayMs: 800, RequestId: "a"}); err != nil {
		t.Fatal(err)
	}
	var delayedSeen bool
	eventually(t, 5*time.Second, "grant after the lock-delay", func() bool {
		resp, err := c.Leases(0).Acquire(ctx, &leasepb.AcquireRequest{Resource: "ld", Holder: "next", TtlMs: 1000, RequestId: "b"})
		if code(err) == codes.FailedPrecondition && heldDetail(err).GetLockDelayed() {
			delayedSeen = true
		}
		return err == nil && resp.GetLease().GetHolder() == "next"
	})
	if !delayedSeen {
		t.Fatal("the resource was never reported as lock-delayed between the expiry and the next grant")
	}
}

func TestWatchTooOldIsOutOfRangeWithOldestIndex(t *testing.T) {
	c := servertest.Start(t, 1, func(cfg *server.Config) { cfg.WatchHistory = 4 })
	ctx := ctxT(t)
	for i := range 10 {
		if _, err := c.Leases(0).Acquire(ctx, &leasepb.AcquireRequest{Resource: fmt.Sprintf("o/%d", i), Holder: "h", TtlMs: 60_000}); err != nil {
			t.Fatal(err)
		}
	}
	stream, err := c.Leases(0).Watch(ctx, &leasepb.WatchRequest{FromIndex: 2})
	if err != nil {
		t.Fatal(err)
	}
	_, err = stream.Recv()
	if code(err) != codes.OutOfRange {
		t.Fatalf("watch from 2 with 4 retained events: %v, want OutOfRange", err)
	}
	var oldest uint64
	for _, d := range status.Convert(err).Details() {
		if w, ok := d.(*leasepb.WatchCompacted); ok {
			oldest = w.GetOldestIndex()
		}
	}
	if oldest <= 2 {
		t.Fatalf("oldest index %d in the details", oldest)
	}
	ok, err := c.Leases(0).Watch(ctx, &leasepb.WatchRequest{FromIndex: oldest})
	if err != nil {
		t.Fatal(err)
	}
	if events := recvEvents(t, ok, 1); events[0].GetIndex() < oldest {
		t.Fatalf("resumed at %d before oldest %d", events[0].GetIndex(), oldest)
	}
}

func TestStatusDescribesEachNode(t *testing.T) {
	c := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	leaders := 0
	for i := range c.Size() {
		st, err := leasepb.NewClusterClient(c.Conn(i)).Status(ctx, &leasepb.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if st.GetName() != c.Config(i).Name || st.GetId() == 0 || st.GetLeaderId() == 0 || st.GetAppliedIndex() == 0 || st.GetDbSizeBytes() == 0 {
			t.Fatalf("status of n%d = %v", i+1, st)
		}
		if st.GetRole() == leasepb.Role_ROLE_LEADER {
			leaders++
		}
	}
	if leaders != 1 {
		t.Fatalf("%d leaders", leaders)
	}
	if _, err := leasepb.NewClusterClient(c.Conn(0)).MemberAdd(ctx, &leasepb.MemberAddRequest{}); code(err) != codes.InvalidArgument {
		t.Fatalf("member add without a name: %v, want InvalidArgument", err)
	}
}
