package server_test

import (
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	spb "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest"
	"github.com/leased/leased/server/servertest/testcerts"
)

// The attacks of issue #10 on the peer port: a forged heartbeat with term 2^64−1 (which made every node
// panic and persisted the wrapped term) and one with a huge commit index (which crashed a follower),
// from strangers and from members speaking for others, with and without peer TLS.

const maxTerm = ^uint64(0)

// forgeLink sends one batch to addr's peer port on a raft link written by hand — the hello, a batch
// frame, the bye — and returns the handshake's error or the refusal the node answered with (nil:
// accepted; the messages may still have been dropped).
func forgeLink(t *testing.T, addr string, cfg *tls.Config, b *wirepb.RaftBatch) error {
	t.Helper()
	const hello = "leased-raft/1\n"
	var c net.Conn
	var err error
	d := &net.Dialer{Timeout: 5 * time.Second}
	if cfg != nil {
		cfg = cfg.Clone()
		cfg.NextProtos = []string{"leased-raft/1"}
		c, err = tls.DialWithDialer(d, "tcp", addr, cfg)
	} else {
		c, err = d.Dial("tcp", addr)
	}
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	raw, err := proto.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	frame := func(kind byte, payload []byte) []byte {
		return append(binary.BigEndian.AppendUint32(nil, uint32(1+len(payload))), append([]byte{kind}, payload...)...)
	}
	msg := append([]byte(hello), frame(1, raw)...)
	if _, err := c.Write(append(msg, frame(2, nil)...)); err != nil {
		return err
	}
	// The node answers the hello (a TLS 1.3 refusal shows here), then ends the link: a refusal frame, or
	// nothing once it has the bye.
	answer, err := io.ReadAll(c)
	if len(answer) < len(hello) || string(answer[:len(hello)]) != hello {
		return fmt.Errorf("no hello back (%q): %v", answer, err)
	}
	if rest := answer[len(hello):]; len(rest) > 5 && rest[4] == 2 {
		st := &spb.Status{}
		if err := proto.Unmarshal(rest[5:], st); err != nil {
			t.Fatal(err)
		}
		return status.ErrorProto(st)
	}
	return nil
}

func batch(t *testing.T, cluster, from, to uint64, msgs ...*raftpb.Message) *wirepb.RaftBatch {
	t.Helper()
	b := &wirepb.RaftBatch{ClusterId: cluster, From: from, To: to}
	for _, m := range msgs {
		m.From, m.To = &from, &to
		raw, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		b.Messages = append(b.Messages, raw)
	}
	return b
}

func heartbeat(term, commit uint64) *raftpb.Message {
	return &raftpb.Message{Type: raftpb.MsgHeartbeat.Enum(), Term: &term, Commit: &commit}
}

// peerCluster is a three-node cluster with a registry per node and the facts an attacker needs.
type peerCluster struct {
	*servertest.Cluster
	regs    []*prometheus.Registry
	cluster uint64
}

func startPeerCluster(t *testing.T, ca *testcerts.CA) *peerCluster {
	t.Helper()
	pc := &peerCluster{}
	perNode := func(cfg *server.Config) {
		reg := prometheus.NewRegistry()
		pc.regs = append(pc.regs, reg)
		cfg.Registerer = reg
	}
	if ca != nil {
		pc.Cluster = servertest.StartTLS(t, 3, ca, perNode)
	} else {
		pc.Cluster = servertest.Start(t, 3, perNode)
	}
	st, err := leasepb.NewClusterClient(pc.Conn(0)).Status(ctxT(t), &leasepb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	pc.cluster = st.GetHeader().GetClusterId()
	return pc
}

func (pc *peerCluster) dropped(t *testing.T, i int, reason string) float64 {
	return gather(t, pc.regs[i]).value("leased_peer_messages_dropped_total", "reason", reason)
}

// healthy checks that no node stopped, no term went near the forged one, and a grant still goes through.
func (pc *peerCluster) healthy(t *testing.T) {
	t.Helper()
	for i := range pc.Size() {
		n := pc.Node(i)
		select {
		case <-n.Done():
			t.Fatalf("node %d stopped: %v", i, n.Err())
		default:
		}
		st, err := leasepb.NewClusterClient(pc.Conn(i)).Status(ctxT(t), &leasepb.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if st.GetTerm() > 1000 {
			t.Fatalf("node %d is at term %d: a forged term got in", i, st.GetTerm())
		}
	}
	if _, err := acquireRetrying(pc.Cluster, ctxT(t), &leasepb.AcquireRequest{Resource: "after-attack", Holder: "h", TtlMs: 60_000}); err != nil {
		t.Fatalf("acquire after the attack: %v", err)
	}
}

// Without peer TLS (a loopback peer port): a stranger's id and a member's id with an absurd term or commit.
func TestForgedPeerMessagesWithoutTLSAreDropped(t *testing.T) {
	pc := startPeerCluster(t, nil)
	f := pc.Follower()
	target := pc.Node(f)
	leader := pc.Node(pc.WaitLeader()).ID()
	for _, b := range []*wirepb.RaftBatch{
		batch(t, pc.cluster, 0xBAD, target.ID(), heartbeat(maxTerm, 0)),
		batch(t, pc.cluster, leader, target.ID(), heartbeat(maxTerm, 0)),
		batch(t, pc.cluster, leader, target.ID(), heartbeat(1, 1<<40)),
	} {
		if err := forgeLink(t, target.PeerAddr(), nil, b); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 10*time.Second, "the forged messages to be counted", func() bool {
		return pc.dropped(t, f, "not_member") == 1 && pc.dropped(t, f, "term") == 1 && pc.dropped(t, f, "commit") == 1
	})
	pc.healthy(t)
}

// With peer TLS: certificates that name no member, or come from another CA, never get to speak.
func TestPeerTLSRefusesNonMembers(t *testing.T) {
	ca := testcerts.NewCA(t, "ca")
	pc := startPeerCluster(t, ca)
	f := pc.Follower()
	target := pc.Node(f)
	other := testcerts.NewCA(t, "other")
	for name, cfg := range map[string]*tls.Config{
		"stranger": testcerts.MutualConfig(ca.Node(t, "intruder"), ca),
		"other CA": testcerts.MutualConfig(other.Node(t, "n1"), ca),
	} {
		if err := forgeLink(t, target.PeerAddr(), cfg, batch(t, pc.cluster, 0xBAD, target.ID(), heartbeat(maxTerm, 0))); err == nil {
			t.Fatalf("%s: a forged heartbeat was accepted", name)
		}
	}
	for _, reason := range []string{"not_member", "term", "sender_mismatch"} {
		if got := pc.dropped(t, f, reason); got != 0 {
			t.Fatalf("%s drops %v: the forged message got past the handshake", reason, got)
		}
	}
	pc.healthy(t)
}

// A member's certificate (n3's, say stolen or a bug) speaking as another member: dropped and counted.
func TestPeerTLSDropsMessagesInAnotherMembersName(t *testing.T) {
	ca := testcerts.NewCA(t, "ca")
	pc := startPeerCluster(t, ca)
	// Node i is n(i+1): take a follower as the target and another member as the one impersonated.
	f := pc.Follower()
	target := pc.Node(f)
	thief, victim := (f+1)%3, (f+2)%3
	cert := ca.Node(t, fmt.Sprintf("n%d", thief+1))
	err := forgeLink(t, target.PeerAddr(), testcerts.MutualConfig(cert, ca),
		batch(t, pc.cluster, pc.Node(victim).ID(), target.ID(), heartbeat(maxTerm, 0), heartbeat(1, 1<<40)))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the impersonation to be counted", func() bool {
		return pc.dropped(t, f, "sender_mismatch") == 2
	})
	pc.healthy(t)
}
