package server_test

import (
	"testing"

	"github.com/leased/leased/server/servertest/testcerts"
)

// The peer credential rules on a running TLS cluster whose client and peer certificates come from one
// CA (the set-up the rules must survive): a client certificate whose CN is a member name, and a client
// certificate with an extra DNS SAN naming a member, are refused at the handshake, both ways into the
// peer port, before raft sees anything.
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
		for _, way := range ways {
			err := way.forge(t, target.PeerAddr(), cfg, batch(t, pc.cluster, leader, target.ID(), heartbeat(maxTerm, 0)))
			if err == nil {
				t.Fatalf("%s on a %s: a forged heartbeat was accepted", name, way.name)
			}
		}
	}
	for _, reason := range []string{"term", "sender_mismatch", "not_member"} {
		if got := pc.dropped(t, f, reason); got != 0 {
			t.Fatalf("%s drops %v: the forged message got past the handshake", reason, got)
		}
	}
	pc.healthy(t)
}
