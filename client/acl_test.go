package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/client"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest"
)

// Identities and ACLs end to end: a real three-node cluster that requires client certificates, founded
// with the rules below, driven through the SDK by clients that present certificates naming identities.

const (
	pRead  = leasepb.Permission_PERMISSION_READ
	pLease = leasepb.Permission_PERMISSION_LEASE
	pAdmin = leasepb.Permission_PERMISSION_ADMIN
)

func aclRule(identity, prefix string, perms ...leasepb.Permission) *leasepb.AclRule {
	return &leasepb.AclRule{Identity: identity, Prefix: prefix, Permissions: perms}
}

var testRules = []*leasepb.AclRule{
	aclRule("ops", "", pRead, pLease, pAdmin),
	aclRule("alice", "jobs/", pRead, pLease),
	aclRule("bob", "jobs/", pRead, pLease),
	aclRule("reader", "", pRead),
	aclRule("spiffe://test/carol", "carol/", pRead, pLease),
}

// lockedBuffer collects the JSON logs of every node.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) lines() []map[string]any {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.Split(b.buf.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

type aclCluster struct {
	*servertest.Cluster
	ca   *servertest.CA
	logs *lockedBuffer
}

func startACLCluster(t *testing.T) *aclCluster {
	t.Helper()
	ca := servertest.NewCA(t)
	logs := &lockedBuffer{}
	cl := servertest.StartWithACL(t, 3, ca, "ops", testRules, func(cfg *server.Config) {
		cfg.Logger = slog.New(slog.NewJSONHandler(io.MultiWriter(logs), nil)).With("node", cfg.Name)
	})
	return &aclCluster{Cluster: cl, ca: ca, logs: logs}
}

// as is an SDK client presenting a certificate that names identity.
func (c *aclCluster) as(t *testing.T, identity string) *client.Client {
	t.Helper()
	return newClient(t, c.Endpoints(), func(cfg *client.Config) { cfg.TLS = c.ca.ClientTLS(identity) })
}

// direct is a raw Leases client of node i presenting identity's certificate: no leader tracking, so the
// call is served (or forwarded) by exactly that node.
func (c *aclCluster) direct(t *testing.T, i int, identity string) leasepb.LeasesClient {
	t.Helper()
	conn, err := grpc.NewClient(c.Config(i).ClientAddr, grpc.WithTransportCredentials(credentials.NewTLS(c.ca.ClientTLS(identity))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return leasepb.NewLeasesClient(conn)
}

func accessOf(t *testing.T, err error) *client.AccessError {
	t.Helper()
	var ae *client.AccessError
	if !errors.As(err, &ae) {
		t.Fatalf("got %v, want an *AccessError", err)
	}
	return ae
}

func accessDetail(t *testing.T, err error, code codes.Code) *leasepb.AccessDenied {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != code {
		t.Fatalf("got %v, want %v", err, code)
	}
	for _, d := range st.Details() {
		if a, ok := d.(*leasepb.AccessDenied); ok {
			return a
		}
	}
	t.Fatalf("%v carries no AccessDenied", err)
	return nil
}

func TestIdentitiesAndACLs(t *testing.T) {
	c := startACLCluster(t)
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, *aclCluster)
	}{
		{"OnlyTheOwnerRenewsOrReleases", testOwnerOnly},
		{"AdminReleaseIsLogged", testAdminRelease},
		{"LeakedRequestIDIsNoImpersonation", testLeakedRequestID},
		{"RequestIDsOfOthersAreBlank", testRequestIDsBlank},
		{"RequestIDReuseWithOtherTTL", testRequestIDReuse},
		{"ReadOnlyCannotAcquire", testReadOnly},
		{"ListNeedsReadOnThePrefix", testListPrefix},
		{"URISANIdentity", testURIIdentity},
		{"ForwardedWritesKeepTheIdentity", testForwarded},
		{"ACLChangeReachesEveryNode", testACLChange},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, c) })
	}
}

func testOwnerOnly(t *testing.T, c *aclCluster) {
	ctx := ctxT(t)
	alice, bob := c.as(t, "alice"), c.as(t, "bob")
	l, err := alice.Acquire(ctx, "jobs/owned", client.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Release(ctx) }()
	info, err := alice.Get(ctx, "jobs/owned")
	if err != nil || info.Identity != "alice" {
		t.Fatalf("get = %+v, %v; want identity alice", info, err)
	}
	_, err = bob.Renew(ctx, "jobs/owned", l.Token())
	if !errors.Is(err, client.ErrPermissionDenied) {
		t.Fatalf("bob renews alice's lease: %v, want ErrPermissionDenied", err)
	}
	if ae := accessOf(t, err); ae.Identity != "bob" || ae.Permission != "admin" || ae.Owner != "alice" || ae.Resource != "jobs/owned" {
		t.Fatalf("denial = %+v", ae)
	}
	if !strings.Contains(err.Error(), `identity "bob" lacks permission admin on "jobs/owned"`) {
		t.Fatalf("message %q does not name the identity and the permission", err)
	}
	if err := bob.Release(ctx, "jobs/owned", l.Token()); !errors.Is(err, client.ErrPermissionDenied) {
		t.Fatalf("bob releases alice's lease: %v", err)
	}
	// KeepAlive: a message naming another identity's lease is refused.
	stream, err := c.direct(t, c.WaitLeader(), "bob").KeepAlive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&leasepb.KeepAliveRequest{Seq: 1, Leases: []*leasepb.LeaseRef{{Resource: "jobs/owned", Token: l.Token()}}}); err != nil {
		t.Fatal(err)
	}
	_, err = stream.Recv()
	if d := accessDetail(t, err, codes.PermissionDenied); d.GetIdentity() != "bob" || d.GetPermission() != pAdmin || d.GetOwner() != "alice" {
		t.Fatalf("keepalive denial = %v", d)
	}
	if cur, err := alice.ValidateToken(ctx, "jobs/owned", l.Token()); err != nil || !cur {
		t.Fatalf("after the refusals the lease is current=%v (%v)", cur, err)
	}
	if l.Err() != nil {
		t.Fatalf("alice's lease ended: %v", l.Err())
	}
}

func testAdminRelease(t *testing.T, c *aclCluster) {
	ctx := ctxT(t)
	alice, ops := c.as(t, "alice"), c.as(t, "ops")
	l, err := alice.Acquire(ctx, "jobs/admin", client.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := ops.Release(ctx, "jobs/admin", l.Token()); err != nil {
		t.Fatalf("admin release: %v", err)
	}
	if cur, err := alice.ValidateToken(ctx, "jobs/admin", l.Token()); err != nil || cur {
		t.Fatalf("after the admin release the token is current=%v (%v)", cur, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, line := range c.logs.lines() {
			if line["msg"] == "lease released by admin" && line["resource"] == "jobs/admin" && line["identity"] == "alice" &&
				line["admin"] == "ops" && line["token"] == float64(l.Token()) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no audit line names both identities of the admin release")
		}
		time.Sleep(20 * time.Millisecond) // poll: nodes log as they apply
	}
}

func testLeakedRequestID(t *testing.T, c *aclCluster) {
	ctx := ctxT(t)
	alice, bob := c.as(t, "alice"), c.as(t, "bob")
	victim, err := alice.Acquire(ctx, "jobs/victim", client.WithTTL(30*time.Second), client.WithHolder("worker-1"), client.WithRequestID("leaked-r1"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = victim.Release(ctx) }()
	// bob knows alice's request id and holder label: he gets "held", never her grant.
	_, err = bob.Acquire(ctx, "jobs/victim", client.WithTTL(30*time.Second), client.WithHolder("worker-1"), client.WithRequestID("leaked-r1"))
	var held *client.HeldError
	if !errors.As(err, &held) || held.Identity != "alice" {
		t.Fatalf("impersonation: %v, want held by identity alice", err)
	}
	if strings.Contains(err.Error(), "leaked-r1") {
		t.Fatalf("the held error shows the request id: %v", err)
	}
	// With the token he also cannot keep it alive or end it.
	if _, err := bob.Renew(ctx, "jobs/victim", victim.Token()); !errors.Is(err, client.ErrPermissionDenied) {
		t.Fatalf("impersonated renew: %v", err)
	}
	// The same request id elsewhere is bob's own, distinct grant.
	own, err := bob.Acquire(ctx, "jobs/bobs", client.WithTTL(30*time.Second), client.WithRequestID("leaked-r1"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = own.Release(ctx) }()
	if own.Token() == victim.Token() {
		t.Fatal("bob got alice's token")
	}
}

func testRequestIDsBlank(t *testing.T, c *aclCluster) {
	ctx := ctxT(t)
	alice, bob := c.as(t, "alice"), c.as(t, "bob")
	events := make(chan client.Event, 16)
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	wg.Go(func() {
		_ = bob.Watch(wctx, client.WatchOptions{Prefix: "jobs/blank"}, func(e client.Event) error {
			events <- e
			return nil
		})
	})
	// The watch starts "from now" after a read; wait until it is in place by polling for a first event.
	var l *client.Lease
	var err error
	// Each try is a new intent with its own request id: a request id whose grant ended is not granted again.
	requestID := ""
	for try := 0; l == nil; try++ {
		requestID = fmt.Sprint("secret-r", try)
		if l, err = alice.Acquire(ctx, "jobs/blank", client.WithTTL(30*time.Second), client.WithRequestID(requestID)); err != nil {
			t.Fatal(err)
		}
		select {
		case e := <-events:
			if e.Lease.RequestID != "" || e.Lease.Identity != "alice" {
				t.Fatalf("bob's watch event shows %+v", e.Lease)
			}
		case <-time.After(2 * time.Second):
			_ = l.Release(ctx) // the watch was not yet in place: again
			l = nil
		}
	}
	defer func() { _ = l.Release(ctx) }()
	if info, err := bob.Get(ctx, "jobs/blank"); err != nil || info.RequestID != "" || info.Identity != "alice" {
		t.Fatalf("bob's get = %+v, %v; want the request id blank", info, err)
	}
	if info, err := alice.Get(ctx, "jobs/blank"); err != nil || info.RequestID != requestID {
		t.Fatalf("alice's get = %+v, %v; want her request id", info, err)
	}
	infos, _, err := bob.List(ctx, client.ListOptions{Prefix: "jobs/blank"})
	if err != nil || len(infos) != 1 || infos[0].RequestID != "" {
		t.Fatalf("bob's list = %+v, %v", infos, err)
	}
	infos, _, err = alice.List(ctx, client.ListOptions{Prefix: "jobs/blank"})
	if err != nil || len(infos) != 1 || infos[0].RequestID != requestID {
		t.Fatalf("alice's list = %+v, %v", infos, err)
	}
}

func testRequestIDReuse(t *testing.T, c *aclCluster) {
	ctx := ctxT(t)
	alice := c.as(t, "alice")
	l, err := alice.Acquire(ctx, "jobs/reuse", client.WithTTL(30*time.Second), client.WithRequestID("r-ttl"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Release(ctx) }()
	_, err = alice.Acquire(ctx, "jobs/reuse", client.WithTTL(50*time.Second), client.WithRequestID("r-ttl"))
	if !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "ttl_ms") || !strings.Contains(err.Error(), "30000") {
		t.Fatalf("reuse with another TTL: %v, want ErrInvalid naming ttl_ms", err)
	}
	_, err = alice.Acquire(ctx, "jobs/reuse-elsewhere", client.WithTTL(30*time.Second), client.WithRequestID("r-ttl"))
	if !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "resource") {
		t.Fatalf("reuse on another resource: %v, want ErrInvalid naming resource", err)
	}
	if _, err := alice.Get(ctx, "jobs/reuse-elsewhere"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("the refused reuse granted: %v", err)
	}
}

func testReadOnly(t *testing.T, c *aclCluster) {
	ctx := ctxT(t)
	reader := c.as(t, "reader")
	_, err := reader.Acquire(ctx, "jobs/ro", client.WithTTL(30*time.Second))
	if !errors.Is(err, client.ErrPermissionDenied) {
		t.Fatalf("read-only acquire: %v", err)
	}
	if ae := accessOf(t, err); ae.Identity != "reader" || ae.Permission != "lease" || ae.Resource != "jobs/ro" {
		t.Fatalf("denial = %+v", ae)
	}
	if _, err := reader.Get(ctx, "jobs/ro"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("read-only get: %v, want NotFound", err)
	}
	// An identity no rule names may do nothing, not even read; Cluster calls need admin.
	stranger := c.as(t, "mallory")
	if _, err := stranger.Get(ctx, "jobs/ro"); !errors.Is(err, client.ErrPermissionDenied) {
		t.Fatalf("stranger get: %v", err)
	}
	if _, _, err := reader.ACL(ctx); !errors.Is(err, client.ErrPermissionDenied) {
		t.Fatalf("reader acl get: %v", err)
	}
	if _, err := reader.SetACL(ctx, nil); !errors.Is(err, client.ErrPermissionDenied) {
		t.Fatalf("reader acl set: %v", err)
	}
	if _, err := reader.Status(ctx, c.Endpoints()[0]); err != nil {
		t.Fatalf("status needs no permission: %v", err)
	}
}

func testListPrefix(t *testing.T, c *aclCluster) {
	ctx := ctxT(t)
	alice := c.as(t, "alice")
	if _, _, err := alice.List(ctx, client.ListOptions{Prefix: "jobs/"}); err != nil {
		t.Fatalf("list of her prefix: %v", err)
	}
	_, _, err := alice.List(ctx, client.ListOptions{})
	if ae := accessOf(t, err); ae.Permission != "read" || ae.Resource != "" {
		t.Fatalf("list of everything: %+v", ae)
	}
	if _, _, err := alice.List(ctx, client.ListOptions{Prefix: "job"}); !errors.Is(err, client.ErrPermissionDenied) {
		t.Fatalf("list of a wider prefix: %v", err)
	}
	err = alice.Watch(ctx, client.WatchOptions{Prefix: "other/", FromIndex: 1}, func(client.Event) error { return nil })
	if !errors.Is(err, client.ErrPermissionDenied) {
		t.Fatalf("watch outside her prefix: %v", err)
	}
}

func testURIIdentity(t *testing.T, c *aclCluster) {
	ctx := ctxT(t)
	carol := c.as(t, "spiffe://test/carol")
	l, err := carol.Acquire(ctx, "carol/x", client.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Release(ctx) }()
	if info, err := carol.Get(ctx, "carol/x"); err != nil || info.Identity != "spiffe://test/carol" {
		t.Fatalf("get = %+v, %v", info, err)
	}
}

func testForwarded(t *testing.T, c *aclCluster) {
	ctx := ctxT(t)
	f := c.Follower()
	resp, err := c.direct(t, f, "alice").Acquire(ctx, &leasepb.AcquireRequest{Resource: "jobs/fwd", Holder: "h", TtlMs: 30_000, RequestId: "fwd"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetLease().GetIdentity() != "alice" || resp.GetLease().GetRequestId() != "fwd" {
		t.Fatalf("forwarded grant = %v, want identity alice", resp.GetLease())
	}
	tok := resp.GetLease().GetToken()
	_, err = c.direct(t, f, "bob").Release(ctx, &leasepb.ReleaseRequest{Resource: "jobs/fwd", Token: tok})
	if d := accessDetail(t, err, codes.PermissionDenied); d.GetIdentity() != "bob" || d.GetOwner() != "alice" {
		t.Fatalf("forwarded release by bob: %v", d)
	}
	if _, err := c.direct(t, f, "alice").Release(ctx, &leasepb.ReleaseRequest{Resource: "jobs/fwd", Token: tok}); err != nil {
		t.Fatalf("forwarded release by alice: %v", err)
	}
}

func testACLChange(t *testing.T, c *aclCluster) {
	ctx := ctxT(t)
	ops := c.as(t, "ops")
	rules, set, err := ops.ACL(ctx)
	if err != nil || !set || len(rules) != len(testRules) {
		t.Fatalf("acl get = %v, %v, %v", rules, set, err)
	}
	// Each node, asked directly with a local (serializable) read: mallory may not read yet.
	readOn := func(i int) error {
		_, err := c.direct(t, i, "mallory").Get(ctx, &leasepb.GetRequest{Resource: "open/x", Serializable: true})
		return err
	}
	for i := range c.Size() {
		if err := readOn(i); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("node %d before the change: %v", i, err)
		}
	}
	// Setting rules that take admin from the one who sets them is refused, and changes nothing.
	if _, err := ops.SetACL(ctx, []*leasepb.AclRule{aclRule("mallory", "", pAdmin)}); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("lockout: %v, want ErrInvalid", err)
	}
	if _, err := ops.SetACL(ctx, []*leasepb.AclRule{aclRule("x", "", leasepb.Permission(7))}); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("bad permission: %v, want ErrInvalid", err)
	}
	changed := append(append([]*leasepb.AclRule(nil), testRules...), aclRule("mallory", "open/", pRead))
	if _, err := ops.SetACL(ctx, changed); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if _, err := ops.SetACL(context.Background(), testRules); err != nil {
			t.Errorf("restore the rules: %v", err)
		}
	}()
	for i := range c.Size() {
		deadline := time.Now().Add(10 * time.Second)
		for {
			err := readOn(i)
			if status.Code(err) == codes.NotFound {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d never applied the change: %v", i, err)
			}
			time.Sleep(20 * time.Millisecond) // poll: a follower applies the entry a moment after the leader
		}
	}
	if rules, _, err := ops.ACL(ctx); err != nil || len(rules) != len(changed) {
		t.Fatalf("acl get after the change = %v, %v", rules, err)
	}
}
