package server_test

import (
	"crypto/tls"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest"
	"github.com/leased/leased/server/servertest/testcerts"
)

// The peer credential rules on a running TLS cluster whose client and peer certificates come from one
// CA (the set-up the rules must survive): a client certificate whose CN is a member name, and a client
// certificate with an extra DNS SAN naming a member, are refused at a raft link's handshake, before
// raft sees anything.
func TestPeerTLSRefusesClientCertificatesNamingMembers(t *testing.T) {
	ca := testcerts.NewCA(t, "ca")
	pc := startPeerCluster(t, ca)
	f := pc.Follower()
	target := pc.Node(f)
	leader := pc.Node(pc.WaitLeader()).ID()
	for name, cert := range map[string]*testcerts.Pair{
		"client certificate with CN n2":       ca.Issue(t, testcerts.Options{CommonName: "n2", Client: true}),
		"alice's certificate with DNS SAN n1": ca.Issue(t, testcerts.Options{CommonName: "alice", DNSNames: []string{"n1"}, Client: true}),
	} {
		cfg := testcerts.MutualConfig(cert, ca)
		if err := forgeLink(t, target.PeerAddr(), cfg, batch(t, pc.cluster, leader, target.ID(), heartbeat(maxTerm, 0))); err == nil {
			t.Fatalf("%s: a forged heartbeat was accepted", name)
		}
	}
	for _, reason := range []string{"term", "sender_mismatch", "not_member"} {
		if got := pc.dropped(t, f, reason); got != 0 {
			t.Fatalf("%s drops %v: the forged message got past the handshake", reason, got)
		}
	}
	pc.healthy(t)
}

// peerCall dials addr's peer port (cfg nil: plaintext) for Join and Forward calls.
func peerCall(t *testing.T, addr string, cfg *tls.Config) wirepb.RaftClient {
	t.Helper()
	creds := insecure.NewCredentials()
	if cfg != nil {
		creds = credentials.NewTLS(cfg)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return wirepb.NewRaftClient(conn)
}

// clientAddrOf is member name's client address in node i's member table.
func clientAddrOf(t *testing.T, c *servertest.Cluster, i int, name string) string {
	t.Helper()
	m := memberNamed(members(t, c, i), name)
	if m == nil {
		t.Fatalf("node %d has no member %s", i, name)
	}
	return m.GetClientAddr()
}

// On a plaintext peer port, a caller that is not the member it names cannot change that member's client
// address: not without the cluster id, not relayed through a follower, and not with the cluster id
// either, since the leader asks the member itself, at its peer address, before it records an address.
func TestJoinCannotChangeAnotherMembersAddress(t *testing.T) {
	pc := startPeerCluster(t, nil)
	pc.WaitSettled()
	li, f := pc.WaitLeader(), pc.Follower()
	victim := pc.Config(f).Name
	want := clientAddrOf(t, pc.Cluster, li, victim)
	const impostor = "127.0.0.1:1"
	leader, follower := peerCall(t, pc.Node(li).PeerAddr(), nil), peerCall(t, pc.Node(f).PeerAddr(), nil)
	for name, call := range map[string]func() error{
		"no cluster id": func() error {
			_, err := leader.Join(ctxT(t), &wirepb.JoinRequest{Name: victim, ClientAddr: impostor})
			return err
		},
		"relayed": func() error {
			_, err := leader.Join(ctxT(t), &wirepb.JoinRequest{Name: victim, ClientAddr: impostor, Relayed: true})
			return err
		},
		"with the cluster id": func() error {
			_, err := leader.Join(ctxT(t), &wirepb.JoinRequest{Name: victim, ClientAddr: impostor, ClusterId: pc.cluster, Relayed: true})
			return err
		},
		"through a follower": func() error {
			_, err := follower.Join(ctxT(t), &wirepb.JoinRequest{Name: pc.Config(li).Name, ClientAddr: impostor, ClusterId: pc.cluster})
			return err
		},
	} {
		err := call()
		if name != "through a follower" && status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s: %v, want PermissionDenied", name, err)
		}
		for i := range pc.Size() {
			if got := clientAddrOf(t, pc.Cluster, i, victim); got != want {
				t.Fatalf("%s: node %d has %s's client address %q, want %q", name, i, victim, got, want)
			}
			if got := clientAddrOf(t, pc.Cluster, i, pc.Config(li).Name); got == impostor {
				t.Fatalf("%s: node %d sends the leader's clients to %q", name, i, got)
			}
		}
	}
	pc.healthy(t)
}

// With peer TLS, a member's certificate can change its own entry only: n3's certificate naming n2 in a
// Join is refused.
func TestJoinWithAnotherMembersCertificateIsRefused(t *testing.T) {
	ca := testcerts.NewCA(t, "ca")
	pc := startPeerCluster(t, ca)
	pc.WaitSettled()
	li := pc.WaitLeader()
	thief, victim := (li+1)%3, (li+2)%3
	cfg := testcerts.MutualConfig(ca.Node(t, pc.Config(thief).Name), ca)
	want := clientAddrOf(t, pc.Cluster, li, pc.Config(victim).Name)
	_, err := peerCall(t, pc.Node(li).PeerAddr(), cfg).Join(ctxT(t),
		&wirepb.JoinRequest{Name: pc.Config(victim).Name, ClientAddr: "127.0.0.1:1", ClusterId: pc.cluster, Relayed: true})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("join naming another member: %v, want PermissionDenied", err)
	}
	if got := clientAddrOf(t, pc.Cluster, li, pc.Config(victim).Name); got != want {
		t.Fatalf("the victim's client address is %q, want %q", got, want)
	}
}

// A forwarded write with a claimed client identity: refused from a non-member and, on a plaintext peer
// port, from anyone (nothing vouches for the identity); with peer TLS, refused when the request claims
// to come from another member than the certificate's. A forwarded write without identity from a member
// still runs.
func TestForwardedIdentityOnlyFromAuthenticatedMember(t *testing.T) {
	acquire := func(from uint64, cluster uint64, identity, resource string) *wirepb.ForwardRequest {
		return &wirepb.ForwardRequest{ClusterId: cluster, From: from, Identity: identity,
			Request: &wirepb.ForwardRequest_Acquire{Acquire: &leasepb.AcquireRequest{Resource: resource, Holder: "h", TtlMs: 60_000}}}
	}
	t.Run("plaintext", func(t *testing.T) {
		pc := startPeerCluster(t, nil)
		li, f := pc.WaitLeader(), pc.Follower()
		leader := peerCall(t, pc.Node(li).PeerAddr(), nil)
		for name, req := range map[string]*wirepb.ForwardRequest{
			"stranger with identity":    acquire(0xBAD, pc.cluster, "admin", "admin/a"),
			"stranger without identity": acquire(0xBAD, pc.cluster, "", "admin/b"),
			"member id with identity":   acquire(pc.Node(f).ID(), pc.cluster, "admin", "admin/c"),
		} {
			if _, err := leader.Forward(ctxT(t), req); status.Code(err) != codes.PermissionDenied {
				t.Errorf("%s: %v, want PermissionDenied", name, err)
			}
		}
		if _, err := leader.Forward(ctxT(t), acquire(pc.Node(f).ID(), pc.cluster, "", "plain/d")); err != nil {
			t.Fatalf("a member's forwarded write without identity: %v", err)
		}
		list, err := pc.Leases(li).List(ctxT(t), &leasepb.ListRequest{Prefix: "admin/"})
		if err != nil || len(list.GetLeases()) != 0 {
			t.Fatalf("refused forwards granted leases: %v, %v", list.GetLeases(), err)
		}
	})
	t.Run("tls", func(t *testing.T) {
		ca := testcerts.NewCA(t, "ca")
		pc := startPeerCluster(t, ca)
		li := pc.WaitLeader()
		thief, victim := (li+1)%3, (li+2)%3
		member := testcerts.MutualConfig(ca.Node(t, pc.Config(thief).Name), ca)
		_, err := peerCall(t, pc.Node(li).PeerAddr(), member).Forward(ctxT(t), acquire(pc.Node(victim).ID(), pc.cluster, "admin", "admin/e"))
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("forward in another member's name: %v, want PermissionDenied", err)
		}
		client := testcerts.MutualConfig(ca.Issue(t, testcerts.Options{CommonName: pc.Config(thief).Name, Client: true}), ca)
		if _, err := peerCall(t, pc.Node(li).PeerAddr(), client).Forward(ctxT(t), acquire(pc.Node(thief).ID(), pc.cluster, "admin", "admin/f")); err == nil {
			t.Fatal("a client certificate naming a member forwarded a write")
		}
		if _, err := peerCall(t, pc.Node(li).PeerAddr(), member).Forward(ctxT(t), acquire(pc.Node(thief).ID(), pc.cluster, "servertest", "ok/g")); err != nil {
			t.Fatalf("a member's own forwarded write: %v", err)
		}
	})
}

// With client certificates required but a plaintext peer port, a follower forwards no identity: it
// answers a write with Unavailable and the leader's hint, and the leader serves the write itself.
func TestPlaintextPeersForwardNoIdentity(t *testing.T) {
	ca := servertest.NewCA(t)
	c := servertest.StartWithACL(t, 3, ca, "ops", aclTestRules, func(cfg *server.Config) { cfg.PeerTLS = nil })
	li, f := c.WaitLeader(), c.Follower()
	req := &leasepb.AcquireRequest{Resource: "plain/a", Holder: "h", TtlMs: 60_000}
	_, err := c.Leases(f).Acquire(ctxT(t), req)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("acquire on a follower: %v, want Unavailable", err)
	}
	var hint *leasepb.LeaderHint
	for _, d := range status.Convert(err).Details() {
		if h, ok := d.(*leasepb.LeaderHint); ok {
			hint = h
		}
	}
	if hint.GetLeaderId() != c.Node(li).ID() {
		t.Fatalf("leader hint %v, want leader %x", hint, c.Node(li).ID())
	}
	resp, err := c.Leases(li).Acquire(ctxT(t), req)
	if err != nil || resp.GetLease().GetIdentity() != "ops" {
		t.Fatalf("acquire on the leader: %v, %v", resp, err)
	}
}
