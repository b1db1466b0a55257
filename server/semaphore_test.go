package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest"
)

// TestSemaphoreSlotsOverTheAPI: slots are granted through a follower, listed one lease each (paging
// through a semaphore's slots), returned by Get, and watched one event per slot.
func TestSemaphoreSlotsOverTheAPI(t *testing.T) {
	c := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	f := c.Follower()
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	stream, err := c.Leases(f).Watch(wctx, &leasepb.WatchRequest{Prefix: "sem/"})
	if err != nil {
		t.Fatal(err)
	}
	var toks []uint64
	for i := range 3 {
		resp, err := acquireRetrying(c, ctx, &leasepb.AcquireRequest{Resource: "sem/a", Holder: fmt.Sprintf("h%d", i), TtlMs: 60_000, Limit: 3, RequestId: fmt.Sprint(i)})
		if err != nil {
			t.Fatal(err)
		}
		toks = append(toks, resp.GetLease().GetToken())
	}
	b, err := acquireRetrying(c, ctx, &leasepb.AcquireRequest{Resource: "sem/b", Holder: "h", TtlMs: 60_000})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Leases(f).Acquire(ctx, &leasepb.AcquireRequest{Resource: "sem/a", Holder: "h9", TtlMs: 60_000, Limit: 3})
	if code(err) != codes.FailedPrecondition || heldDetail(err).GetLimit() != 3 || heldDetail(err).GetToken() != toks[0] {
		t.Fatalf("a fourth slot of three: %v", err)
	}
	get, err := c.Leases(f).Get(ctx, &leasepb.GetRequest{Resource: "sem/a"})
	if err != nil || len(get.GetSlots()) != 3 || get.GetLease().GetToken() != toks[0] || get.GetSlots()[2].GetToken() != toks[2] {
		t.Fatalf("get = %v, %v", get, err)
	}
	var got []string
	page := ""
	for range 10 {
		resp, err := c.Leases(f).List(ctx, &leasepb.ListRequest{Prefix: "sem/", Limit: 2, PageToken: page})
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range resp.GetLeases() {
			got = append(got, fmt.Sprintf("%s:%d", l.GetResource(), l.GetLimit()))
		}
		if page = resp.GetNextPageToken(); page == "" {
			break
		}
	}
	if fmt.Sprint(got) != "[sem/a:3 sem/a:3 sem/a:3 sem/b:0]" {
		t.Fatalf("paged list = %v", got)
	}
	if _, err := c.Leases(f).Release(ctx, &leasepb.ReleaseRequest{Resource: "sem/a", Token: toks[1]}); err != nil {
		t.Fatal(err)
	}
	var events []string
	for len(events) < 5 {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range resp.GetEvents() {
			events = append(events, fmt.Sprintf("%v %s %d", e.GetType(), e.GetLease().GetResource(), e.GetLease().GetToken()))
		}
	}
	want := fmt.Sprint([]string{
		fmt.Sprintf("EVENT_TYPE_GRANTED sem/a %d", toks[0]), fmt.Sprintf("EVENT_TYPE_GRANTED sem/a %d", toks[1]),
		fmt.Sprintf("EVENT_TYPE_GRANTED sem/a %d", toks[2]), fmt.Sprintf("EVENT_TYPE_GRANTED sem/b %d", b.GetLease().GetToken()),
		fmt.Sprintf("EVENT_TYPE_RELEASED sem/a %d", toks[1]),
	})
	if fmt.Sprint(events) != want {
		t.Fatalf("events %v, want %v", events, want)
	}
}

// TestSemaphoreAndProclaimAreValidated: every limit is enforced at the edge with InvalidArgument naming
// the field, and a limit that disagrees with the live slots is InvalidArgument on "limit".
func TestSemaphoreAndProclaimAreValidated(t *testing.T) {
	c := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	cl := c.Leases(c.Follower())
	if _, err := acquireRetrying(c, ctx, &leasepb.AcquireRequest{Resource: "v/s", Holder: "h", TtlMs: 60_000, Limit: 2}); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		call  func() error
		field string
	}{
		"limit above the maximum": {func() error {
			_, err := cl.Acquire(ctx, &leasepb.AcquireRequest{Resource: "v/x", Holder: "h", TtlMs: 60_000, Limit: 1001})
			return err
		}, "limit"},
		"a slot with a lock-delay": {func() error {
			_, err := cl.Acquire(ctx, &leasepb.AcquireRequest{Resource: "v/x", Holder: "h", TtlMs: 60_000, Limit: 2, LockDelayMs: 10})
			return err
		}, "lock_delay_ms"},
		"another limit": {func() error {
			_, err := cl.Acquire(ctx, &leasepb.AcquireRequest{Resource: "v/s", Holder: "h2", TtlMs: 60_000, Limit: 3})
			return err
		}, "limit"},
		"proclaim without a token": {func() error {
			_, err := cl.Proclaim(ctx, &leasepb.ProclaimRequest{Resource: "v/s"})
			return err
		}, "token"},
		"proclaim an oversized value": {func() error {
			_, err := cl.Proclaim(ctx, &leasepb.ProclaimRequest{Resource: "v/s", Token: 1, Value: make([]byte, 4097)})
			return err
		}, "value"},
		"a page token this server did not issue": {func() error {
			_, err := cl.List(ctx, &leasepb.ListRequest{PageToken: "v/s#x"})
			return err
		}, "page_token"},
	} {
		err := tc.call()
		if code(err) != codes.InvalidArgument || badField(err) != tc.field {
			t.Errorf("%s: %v, want InvalidArgument on %q", name, err, tc.field)
		}
	}
}

// TestProclaimIsTheOwnersOrAnAdmins: with identities, Proclaim of another identity's lease needs admin.
func TestProclaimIsTheOwnersOrAnAdmins(t *testing.T) {
	ca := servertest.NewCA(t)
	c := servertest.StartWithACL(t, 3, ca, "ops", append(aclTestRules,
		&leasepb.AclRule{Identity: "bob", Prefix: "jobs/", Permissions: []leasepb.Permission{leasepb.Permission_PERMISSION_LEASE}}), func(*server.Config) {})
	ctx := ctxT(t)
	as := func(identity string) leasepb.LeasesClient {
		conn, err := grpc.NewClient(c.Config(c.Follower()).ClientAddr, grpc.WithTransportCredentials(credentials.NewTLS(ca.ClientTLS(identity))))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return leasepb.NewLeasesClient(conn)
	}
	g, err := as("alice").Acquire(ctx, &leasepb.AcquireRequest{Resource: "jobs/leader", Holder: "a", TtlMs: 60_000, Value: []byte("a")})
	if err != nil {
		t.Fatal(err)
	}
	tok := g.GetLease().GetToken()
	if _, err := as("bob").Proclaim(ctx, &leasepb.ProclaimRequest{Resource: "jobs/leader", Token: tok, Value: []byte("b")}); code(err) != codes.PermissionDenied {
		t.Fatalf("bob proclaims alice's lease: %v", err)
	}
	p, err := as("alice").Proclaim(ctx, &leasepb.ProclaimRequest{Resource: "jobs/leader", Token: tok, Value: []byte("a2")})
	if err != nil || p.GetLease().GetToken() != tok || string(p.GetLease().GetValue()) != "a2" {
		t.Fatalf("alice proclaims: %v, %v", p, err)
	}
	if _, err := as("ops").Proclaim(ctx, &leasepb.ProclaimRequest{Resource: "jobs/leader", Token: tok, Value: []byte("ops")}); err != nil {
		t.Fatalf("an admin proclaims: %v", err)
	}
}

func statusOf(err error) (*status.Status, bool) { return status.FromError(err) }

// badField is the field a google.rpc.BadRequest detail of err names ("" without one).
func badField(err error) string {
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) > 0 {
			return br.GetFieldViolations()[0].GetField()
		}
	}
	return ""
}

// TestSemaphoreSlotsSurviveASnapshotAndExpireUnderANewLeader: a follower that catches up from a snapshot
// holds the semaphore's slots; after the leader is killed, the new leader's lessor (rebuilt per slot)
// expires each unrenewed slot, and the resource is free again.
func TestSemaphoreSlotsSurviveASnapshotAndExpireUnderANewLeader(t *testing.T) {
	c := servertest.Start(t, 3, func(cfg *server.Config) { cfg.SnapshotEntries, cfg.SnapshotCatchUp = 20, 2 })
	ctx := ctxT(t)
	f := c.Follower()
	stoppedAt := stopBehind(t, c, f, "behind")
	ttl := c.Config(0).TTLFloor().Milliseconds()
	for i := range 2 {
		if _, err := acquireRetrying(c, ctx, &leasepb.AcquireRequest{Resource: "sem/snap", Holder: "h", TtlMs: ttl, Limit: 2, RequestId: fmt.Sprint("s", i)}); err != nil {
			t.Fatal(err)
		}
	}
	compactPast(t, c, stoppedAt, "fill")
	c.Restart(f)
	c.WaitSettled()
	if c.Node(f).SnapshotsRestored() == 0 {
		t.Fatal("the follower caught up without a snapshot")
	}
	got, err := c.Leases(f).Get(ctx, &leasepb.GetRequest{Resource: "sem/snap", Serializable: true})
	if err != nil || len(got.GetSlots()) != 2 {
		t.Fatalf("restored follower: %v, %v", got, err)
	}
	c.Stop(c.WaitLeader())
	c.WaitLeader()
	deadline := time.Now().Add(10 * time.Duration(ttl) * time.Millisecond)
	for {
		_, err := retrying(c, ctx, func(ctx context.Context, cl leasepb.LeasesClient) (*leasepb.GetResponse, error) {
			return cl.Get(ctx, &leasepb.GetRequest{Resource: "sem/snap"})
		})
		if code(err) == codes.NotFound {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the unrenewed slots were not expired by the new leader: %v", err)
		}
		<-time.After(50 * time.Millisecond) // poll interval
	}
}
