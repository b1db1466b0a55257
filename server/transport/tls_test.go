package transport

import (
	"bufio"
	"crypto/tls"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/server/servertest/testcerts"
)

// members is a fixed member table n1..n3 = raft ids 1..3.
func members(name string) (uint64, bool) {
	id, ok := map[string]uint64{"n1": 1, "n2": 2, "n3": 3}[name]
	return id, ok
}

// rejections records OnRejected calls.
type rejections struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *rejections) add(reason string, count int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = make(map[string]int)
	}
	r.n[reason] += count
}

func (r *rejections) get(reason string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[reason]
}

// tlsNode starts a transport with mutual TLS, serving and presenting cert.
func tlsNode(t *testing.T, id uint64, ca *testcerts.CA, cert *testcerts.Pair, rej *rejections) *node {
	return startNode(t, id, func(c *Config) {
		c.TLS, c.MemberID = testcerts.MutualConfig(cert, ca), members
		if rej != nil {
			c.OnRejected = rej.add
		}
	})
}

// openTLSLink opens a link to addr over TLS with tlsCfg, as a hand-written peer would: the handshake
// offering linkALPN, then the hello both ways. With TLS 1.3 a refused client certificate shows only
// when the hello is read.
func openTLSLink(t *testing.T, addr string, tlsCfg *tls.Config) (*handLink, error) {
	t.Helper()
	tlsCfg = tlsCfg.Clone()
	tlsCfg.NextProtos = []string{linkALPN}
	c, err := tls.Dial("tcp", addr, tlsCfg)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(linkHello)); err != nil {
		return nil, err
	}
	head := make([]byte, len(linkHello))
	if _, err := io.ReadFull(c, head); err != nil {
		return nil, err
	}
	if string(head) != linkHello {
		t.Fatalf("hello answered with %q", head)
	}
	return &handLink{t: t, conn: c, fr: &frameReader{r: bufio.NewReader(c), limit: 1 << 20}}, nil
}

func tlsLink(t *testing.T, addr string, tlsCfg *tls.Config) *handLink {
	t.Helper()
	h, err := openTLSLink(t, addr, tlsCfg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func batchOf(t *testing.T, from, to uint64, msgs ...*raftpb.Message) *wirepb.RaftBatch {
	t.Helper()
	b := &wirepb.RaftBatch{ClusterId: 0xC1, From: from, To: to}
	for _, m := range msgs {
		raw, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		b.Messages = append(b.Messages, raw)
	}
	return b
}

func TestMutualTLSBetweenMembers(t *testing.T) {
	ca := testcerts.NewCA(t, "ca")
	a := tlsNode(t, 1, ca, ca.Node(t, "n1"), nil)
	b := tlsNode(t, 2, ca, ca.Node(t, "n2"), nil)
	connect(a, b)
	a.tr.Send([]*raftpb.Message{msg(raftpb.MsgHeartbeat, 1, 2, 5)})
	b.tr.Send([]*raftpb.Message{msg(raftpb.MsgHeartbeat, 2, 1, 6)})
	waitFor(t, "both heartbeats over TLS", func() bool { return len(b.raft.from(1)) == 1 && len(a.raft.from(2)) == 1 })
}

// A client certificate that names no member, one from another CA, or none at all: the handshake fails
// and nothing reaches raft.
func TestTLSRefusesNonMembers(t *testing.T) {
	ca, other := testcerts.NewCA(t, "ca"), testcerts.NewCA(t, "other")
	b := tlsNode(t, 2, ca, ca.Node(t, "n2"), nil)
	for name, cfg := range map[string]*tls.Config{
		"not a member":   testcerts.MutualConfig(ca.Node(t, "intruder"), ca),
		"other CA":       testcerts.MutualConfig(other.Node(t, "n1"), ca),
		"no client cert": testcerts.ClientConfig(nil, ca.Pool()),
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := openTLSLink(t, b.addr, cfg); err == nil {
				t.Fatal("a non-member's link was accepted")
			}
		})
	}
	if got := b.raft.count(); got != 0 {
		t.Fatalf("raft processed %d messages from non-members", got)
	}
}

// A certificate chaining to the peer CA is a member credential only if it is meant for peers: both the
// serverAuth and clientAuth extended key usages, and within the allowed CNs and host names. A client
// certificate whose CN is a member name, or one with an extra DNS SAN naming a member, opens no link.
func TestTLSRefusesNonPeerCertificates(t *testing.T) {
	ca := testcerts.NewCA(t, "ca")
	for _, tc := range []struct {
		name  string
		cert  *testcerts.Pair
		allow func(*Config)
	}{
		{"client certificate with a member's CN", ca.Issue(t, testcerts.Options{CommonName: "n1", Client: true}), nil},
		{"client certificate with a member's DNS SAN", ca.Issue(t, testcerts.Options{CommonName: "alice", DNSNames: []string{"n1"}, Client: true}), nil},
		{"server-only certificate", ca.Issue(t, testcerts.Options{CommonName: "n1", DNSNames: []string{"n1"}, Server: true}), nil},
		{"no extended key usage", ca.Issue(t, testcerts.Options{CommonName: "n1", DNSNames: []string{"n1"}}), nil},
		{"CN not allowed", ca.Node(t, "n1"), func(c *Config) { c.AllowedCNs = []string{"n2", "n3"} }},
		{"host name not allowed", ca.Node(t, "n1"), func(c *Config) { c.AllowedHostnames = []string{"peers.example"} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := startNode(t, 2, func(c *Config) {
				c.TLS, c.MemberID = testcerts.MutualConfig(ca.Node(t, "n2"), ca), members
				if tc.allow != nil {
					tc.allow(c)
				}
			})
			if _, err := openTLSLink(t, b.addr, testcerts.MutualConfig(tc.cert, ca)); err == nil {
				t.Fatal("the link was accepted")
			}
			if got := b.raft.count(); got != 0 {
				t.Fatalf("raft processed %d messages", got)
			}
		})
	}
}

// The allowed CNs and host names let the certificates they name through, both ways.
func TestTLSAllowedNamesAdmitMembers(t *testing.T) {
	ca := testcerts.NewCA(t, "ca")
	allow := func(c *Config) {
		c.AllowedCNs, c.AllowedHostnames = []string{"n1", "n2"}, []string{"localhost"}
	}
	start := func(id uint64, name string) *node {
		return startNode(t, id, func(c *Config) {
			c.TLS, c.MemberID = testcerts.MutualConfig(ca.Node(t, name), ca), members
			allow(c)
		})
	}
	a, b := start(1, "n1"), start(2, "n2")
	connect(a, b)
	a.tr.Send([]*raftpb.Message{msg(raftpb.MsgHeartbeat, 1, 2, 5)})
	b.tr.Send([]*raftpb.Message{msg(raftpb.MsgHeartbeat, 2, 1, 6)})
	waitFor(t, "both heartbeats", func() bool { return len(b.raft.from(1)) == 1 && len(a.raft.from(2)) == 1 })
}

// A member's certificate speaking for another member: its batches are dropped and counted, the link
// stays, and what it says as itself is delivered.
func TestTLSDropsSenderMismatch(t *testing.T) {
	ca := testcerts.NewCA(t, "ca")
	rej := &rejections{}
	b := tlsNode(t, 2, ca, ca.Node(t, "n2"), rej)
	h := tlsLink(t, b.addr, testcerts.MutualConfig(ca.Node(t, "n3"), ca))
	h.batch(batchOf(t, 1, 2, msg(raftpb.MsgHeartbeat, 1, 2, 1), msg(raftpb.MsgHeartbeat, 1, 2, 2)))
	waitFor(t, "the forged batch to be counted", func() bool { return rej.get(RejectSenderMismatch) == 2 })
	h.batch(batchOf(t, 3, 2, msg(raftpb.MsgHeartbeat, 3, 2, 3)))
	waitFor(t, "member 3's own message", func() bool { return len(b.raft.from(3)) == 1 })
	if got := b.raft.from(1); len(got) != 0 {
		t.Fatalf("raft processed %d messages forged as member 1", len(got))
	}
}

// Dialing member 2 and reaching a server whose certificate names member 3: the dial refuses it.
func TestTLSDialChecksTheMemberReached(t *testing.T) {
	ca := testcerts.NewCA(t, "ca")
	a := tlsNode(t, 1, ca, ca.Node(t, "n1"), nil)
	impostor := tlsNode(t, 2, ca, ca.Node(t, "n3"), nil)
	a.tr.AddPeer(2, impostor.addr)
	waitFor(t, "the dial to fail", func() bool {
		a.tr.Send([]*raftpb.Message{msg(raftpb.MsgHeartbeat, 1, 2, 1)})
		return a.tr.Stats().SendFailures > 0
	})
	if got := impostor.raft.count(); got != 0 {
		t.Fatalf("impostor received %d messages", got)
	}
}

func TestTLSNeedsMemberID(t *testing.T) {
	ca := testcerts.NewCA(t, "ca")
	cfg := testConfig(t, 1, newFakeRaft())
	cfg.TLS = testcerts.MutualConfig(ca.Node(t, "n1"), ca)
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "MemberID") {
		t.Fatalf("New without MemberID: %v", err)
	}
}
