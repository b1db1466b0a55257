package server_test

import (
	"fmt"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest"
)

var aclTestRules = []*leasepb.AclRule{
	{Identity: "ops", Prefix: "", Permissions: []leasepb.Permission{leasepb.Permission_PERMISSION_READ, leasepb.Permission_PERMISSION_LEASE, leasepb.Permission_PERMISSION_ADMIN}},
	{Identity: "alice", Prefix: "jobs/", Permissions: []leasepb.Permission{leasepb.Permission_PERMISSION_READ, leasepb.Permission_PERMISSION_LEASE}},
	{Identity: "reader", Prefix: "", Permissions: []leasepb.Permission{leasepb.Permission_PERMISSION_READ}},
}

// TestForwardedIdentityIsTheLeadersToEnforce: a write forwarded over the peer port carries the identity
// the follower decided, and the leader enforces ownership and ACLs for it. A leader that requires client
// certificates refuses a forwarded write without identity (a member started without the flag). The
// writes are forwarded as the follower, with its peer certificate.
func TestForwardedIdentityIsTheLeadersToEnforce(t *testing.T) {
	ca := servertest.NewCA(t)
	c := servertest.StartWithACL(t, 3, ca, "ops", aclTestRules, nil)
	ctx := ctxT(t)
	li, fi := c.WaitLeader(), c.Follower()
	conn, err := grpc.NewClient(c.Node(li).PeerAddr(), grpc.WithTransportCredentials(credentials.NewTLS(c.Config(fi).PeerTLS)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	vt, err := c.Leases(li).ValidateToken(ctx, &leasepb.ValidateTokenRequest{Resource: "x", Token: 1})
	if err != nil {
		t.Fatal(err)
	}
	forward := func(identity string, req *wirepb.ForwardRequest) (*wirepb.ForwardResponse, error) {
		req.ClusterId, req.From, req.Identity = vt.GetHeader().GetClusterId(), c.Node(fi).ID(), identity
		return wirepb.NewRaftClient(conn).Forward(ctx, req)
	}
	acquire := func(resource string) *wirepb.ForwardRequest {
		return &wirepb.ForwardRequest{Request: &wirepb.ForwardRequest_Acquire{Acquire: &leasepb.AcquireRequest{Resource: resource, Holder: "h", TtlMs: 30_000}}}
	}
	if _, err := forward("", acquire("jobs/none")); code(err) != codes.Unauthenticated {
		t.Fatalf("forwarded without identity: %v, want Unauthenticated", err)
	}
	if _, err := forward("reader", acquire("jobs/ro")); code(err) != codes.PermissionDenied {
		t.Fatalf("forwarded as reader: %v, want PermissionDenied", err)
	}
	resp, err := forward("alice", acquire("jobs/a"))
	if err != nil || resp.GetAcquire().GetLease().GetIdentity() != "alice" {
		t.Fatalf("forwarded as alice: %v, %v", resp, err)
	}
	tok := resp.GetAcquire().GetLease().GetToken()
	_, err = forward("reader", &wirepb.ForwardRequest{Request: &wirepb.ForwardRequest_Release{Release: &leasepb.ReleaseRequest{Resource: "jobs/a", Token: tok}}})
	if code(err) != codes.PermissionDenied {
		t.Fatalf("forwarded release by reader: %v", err)
	}
	var denied *leasepb.AccessDenied
	for _, d := range status.Convert(err).Details() {
		if a, ok := d.(*leasepb.AccessDenied); ok {
			denied = a
		}
	}
	if denied.GetIdentity() != "reader" || denied.GetPermission() != leasepb.Permission_PERMISSION_ADMIN || denied.GetOwner() != "alice" {
		t.Fatalf("detail %v", denied)
	}
	if _, err := forward("ops", &wirepb.ForwardRequest{Request: &wirepb.ForwardRequest_Release{Release: &leasepb.ReleaseRequest{Resource: "jobs/a", Token: tok}}}); err != nil {
		t.Fatalf("forwarded admin release: %v", err)
	}
}

// TestIdentitiesAndACLSurviveASnapshot: a follower that missed the log and catches up by snapshot
// enforces the same rules and owners as the leader.
func TestIdentitiesAndACLSurviveASnapshot(t *testing.T) {
	ca := servertest.NewCA(t)
	c := servertest.StartWithACL(t, 3, ca, "ops", aclTestRules, func(cfg *server.Config) { cfg.SnapshotEntries, cfg.SnapshotCatchUp = 20, 2 })
	ctx := ctxT(t)
	f := c.Follower()
	stoppedAt := stopBehind(t, c, f, "jobs/behind")
	for i := range 40 {
		if _, err := acquireRetrying(c, ctx, &leasepb.AcquireRequest{Resource: fmt.Sprintf("jobs/%d", i), Holder: "h", TtlMs: 60_000, RequestId: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	compactPast(t, c, stoppedAt, "jobs/fill")
	c.Restart(f)
	c.WaitSettled()
	if c.Node(f).SnapshotsRestored() == 0 {
		t.Fatal("the follower caught up without a snapshot")
	}
	as := func(identity string) leasepb.LeasesClient {
		conn, err := grpc.NewClient(c.Config(f).ClientAddr, grpc.WithTransportCredentials(credentials.NewTLS(ca.ClientTLS(identity))))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return leasepb.NewLeasesClient(conn)
	}
	got, err := as("reader").Get(ctx, &leasepb.GetRequest{Resource: "jobs/7", Serializable: true})
	if err != nil || got.GetLease().GetIdentity() != "ops" || got.GetLease().GetRequestId() != "" {
		t.Fatalf("restored lease as reader sees it: %v, %v (want identity ops, request id blank)", got, err)
	}
	if got, err := as("ops").Get(ctx, &leasepb.GetRequest{Resource: "jobs/7", Serializable: true}); err != nil || got.GetLease().GetRequestId() != "7" {
		t.Fatalf("restored lease as its owner sees it: %v, %v", got, err)
	}
	if _, err := as("alice").Get(ctx, &leasepb.GetRequest{Resource: "other/x", Serializable: true}); code(err) != codes.PermissionDenied {
		t.Fatalf("restored rules: alice reads outside her prefix: %v", err)
	}
}
