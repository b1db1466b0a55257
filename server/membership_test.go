package server_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest"
	"github.com/leased/leased/server/servertest/testcerts"
)

// members asks node i for the member table, serializably (a node without a leader still answers).
func members(t *testing.T, c *servertest.Cluster, i int) []*leasepb.Member {
	t.Helper()
	conn := c.Conn(i)
	if conn == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	resp, err := leasepb.NewClusterClient(conn).MemberList(ctx, &leasepb.MemberListRequest{Serializable: true})
	if err != nil {
		return nil
	}
	return resp.GetMembers()
}

func memberNamed(ms []*leasepb.Member, name string) *leasepb.Member {
	for _, m := range ms {
		if m.GetName() == name {
			return m
		}
	}
	return nil
}

// joiner is a node started outside the servertest cluster, with --initial-cluster-state existing.
type joiner struct {
	cfg  server.Config
	srv  *server.Server
	conn *grpc.ClientConn
}

func startJoiner(t *testing.T, c *servertest.Cluster, name string, lis server.Listeners) *joiner {
	t.Helper()
	return startJoinerWith(t, c, name, lis, nil, insecure.NewCredentials())
}

// startJoinerWith is startJoiner with mutate applied to the node's configuration and creds securing
// the test's connection to it.
func startJoinerWith(t *testing.T, c *servertest.Cluster, name string, lis server.Listeners, mutate func(*server.Config), creds credentials.TransportCredentials) *joiner {
	t.Helper()
	cfg := server.TestConfig()
	cfg.Name = name
	cfg.DataDir = filepath.Join(t.TempDir(), name)
	cfg.ClientAddr, cfg.PeerAddr = lis.Client.Addr().String(), lis.Peer.Addr().String()
	cfg.InitialCluster = map[string]string{c.Config(0).Name: c.Config(0).PeerAddr}
	cfg.InitialClusterState = server.ClusterStateExisting
	cfg.JoinTimeout = 10 * time.Second
	verboseLogs(t)(&cfg)
	if mutate != nil {
		mutate(&cfg)
	}
	srv, err := server.New(cfg, lis)
	if err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	srv.Start()
	conn, err := grpc.NewClient(cfg.ClientAddr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	j := &joiner{cfg: cfg, srv: srv, conn: conn}
	t.Cleanup(func() { _ = conn.Close(); _ = srv.Close() })
	return j
}

// verboseLogs sends a node's logs to the test's output with -v (and LEASED_TEST_LOG set).
func verboseLogs(t *testing.T) func(*server.Config) {
	return func(cfg *server.Config) {
		if testing.Verbose() && os.Getenv("LEASED_TEST_LOG") != "" {
			cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo})).With("n", cfg.Name)
		}
	}
}

func listeners(t *testing.T) server.Listeners {
	t.Helper()
	cl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return server.Listeners{Client: cl, Peer: pl}
}

// TestMemberAddJoinPromoteRemove grows a three-node cluster by a learner that joins with state
// "existing", sees the leader promote it, removes it again, and checks that the removed node stopped and
// refuses its data dir.
func TestMemberAddJoinPromoteRemove(t *testing.T) {
	c := servertest.Start(t, 3, verboseLogs(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Every founding member announces its client address into the table.
	eventually(t, 10*time.Second, "client addresses in the member table", func() bool {
		ms := members(t, c, 0)
		for _, m := range ms {
			if m.GetClientAddr() == "" {
				return false
			}
		}
		return len(ms) == 3
	})

	// A follower hints clients to the leader's advertised client address, from the member table.
	f := c.Follower()
	_, err := leasepb.NewClusterClient(c.Conn(f)).MemberAdd(ctx, &leasepb.MemberAddRequest{Name: "n9", PeerAddr: "127.0.0.1:9"})
	var hint *leasepb.LeaderHint
	for _, d := range status.Convert(err).Details() {
		if h, ok := d.(*leasepb.LeaderHint); ok {
			hint = h
		}
	}
	if status.Code(err) != codes.Unavailable || hint.GetLeaderAddr() != c.Config(c.WaitLeader()).ClientAddr {
		t.Fatalf("member add at follower n%d: %v (hint %v), want Unavailable hinting the leader's client address", f+1, err, hint)
	}

	// Enough entries that the log is compacted (TestConfig snapshots every 200): n4 catches up from a
	// snapshot, which carries the member table.
	leader := c.WaitLeader()
	for i := range 250 {
		if _, err := c.Leases(leader).Acquire(ctx, &leasepb.AcquireRequest{Resource: fmt.Sprintf("fill/%d", i), Holder: "h", TtlMs: 60_000}); err != nil {
			t.Fatalf("acquire: %v", err)
		}
	}
	lis := listeners(t)
	// A leader change on a loaded machine refuses the add before proposing it (outcome known): ask the
	// next leader.
	var cc leasepb.ClusterClient
	var add *leasepb.MemberAddResponse
	eventually(t, 20*time.Second, "n4 added", func() bool {
		leader = c.WaitLeader()
		cc = leasepb.NewClusterClient(c.Conn(leader))
		add, err = cc.MemberAdd(ctx, &leasepb.MemberAddRequest{Name: "n4", PeerAddr: lis.Peer.Addr().String()})
		if status.Code(err) == codes.Unavailable {
			for _, d := range status.Convert(err).Details() {
				if h, ok := d.(*leasepb.LeaderHint); ok && !h.GetOutcomeUnknown() {
					return false
				}
			}
		}
		if err != nil {
			t.Fatalf("member add: %v", err)
		}
		return true
	})
	if !add.GetMember().GetIsLearner() || len(add.GetMembers()) != 4 {
		t.Fatalf("member add answered %v", add)
	}
	// A duplicate name, and a duplicate peer address, are refused.
	if _, err := cc.MemberAdd(ctx, &leasepb.MemberAddRequest{Name: "n4", PeerAddr: "127.0.0.1:1"}); status.Code(err) != codes.AlreadyExists {
		t.Errorf("second add of n4: %v, want AlreadyExists", err)
	}
	if _, err := cc.MemberAdd(ctx, &leasepb.MemberAddRequest{Name: "n5", PeerAddr: lis.Peer.Addr().String()}); status.Code(err) != codes.AlreadyExists {
		t.Errorf("add with n4's peer address: %v, want AlreadyExists", err)
	}
	if _, err := cc.MemberAdd(ctx, &leasepb.MemberAddRequest{Name: "n5", PeerAddr: "0.0.0.0:7000"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("add with an unspecified peer address: %v, want InvalidArgument", err)
	}
	if _, err := cc.MemberPromote(ctx, &leasepb.MemberPromoteRequest{Id: 12345}); status.Code(err) != codes.NotFound {
		t.Errorf("promote of an unknown member: %v, want NotFound", err)
	}
	id := add.GetMember().GetId()
	// Not started yet: it cannot have caught up.
	if _, err := cc.MemberPromote(ctx, &leasepb.MemberPromoteRequest{Id: id}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("promote of a learner that has not caught up: %v, want FailedPrecondition", err)
	}

	j := startJoiner(t, c, "n4", lis)
	if j.srv.ID() != id {
		t.Fatalf("joined as %x, added as %x", j.srv.ID(), id)
	}
	eventually(t, 30*time.Second, "n4 promoted with its client address", func() bool {
		m := memberNamed(members(t, c, leader), "n4")
		return m != nil && !m.GetIsLearner() && m.GetClientAddr() == j.cfg.ClientAddr
	})
	// n4's own table (restored from the snapshot, then applied) is the cluster's.
	ctx4, cancel4 := context.WithTimeout(ctx, 5*time.Second)
	defer cancel4()
	own, err := leasepb.NewClusterClient(j.conn).MemberList(ctx4, &leasepb.MemberListRequest{})
	if err != nil || len(own.GetMembers()) != 4 || j.srv.AppliedIndex() < 250 {
		t.Fatalf("n4's member list: %v %v (applied %d)", own, err, j.srv.AppliedIndex())
	}
	if j.srv.SnapshotsRestored() == 0 {
		t.Error("n4 caught up without a snapshot: the test no longer covers joining from one")
	}

	if _, err := leasepb.NewClusterClient(c.Conn(c.WaitLeader())).MemberRemove(ctx, &leasepb.MemberRemoveRequest{Id: id}); err != nil {
		t.Fatalf("member remove: %v", err)
	}
	select {
	case <-j.srv.Done():
	case <-time.After(15 * time.Second):
		t.Fatal("the removed node did not stop")
	}
	if !errors.Is(j.srv.Err(), server.ErrRemoved) {
		t.Fatalf("removed node stopped with %v", j.srv.Err())
	}
	_ = j.srv.Close()
	if _, err := server.New(j.cfg, server.Listeners{}); err == nil || !strings.Contains(err.Error(), "was removed") {
		t.Fatalf("restart of the removed node: %v, want a refusal saying it was removed", err)
	}
	if ms := members(t, c, c.WaitLeader()); len(ms) != 3 || memberNamed(ms, "n4") != nil {
		t.Fatalf("members after the removal: %v", ms)
	}
	// Every remaining node drops raft messages from the removed member, and still takes them from the others.
	for i := range 3 {
		eventually(t, 10*time.Second, fmt.Sprintf("n%d refuses n4's messages", i+1), func() bool { return !c.Node(i).AcceptsPeer(id) })
		if other := c.Node((i + 1) % 3).ID(); !c.Node(i).AcceptsPeer(other) {
			t.Errorf("n%d refuses member %x", i+1, other)
		}
	}
	// A removed name may be added again, under a new raft id; the old id stays retired.
	added, err := leasepb.NewClusterClient(c.Conn(c.WaitLeader())).MemberAdd(ctx, &leasepb.MemberAddRequest{Name: "n4", PeerAddr: "127.0.0.1:2"})
	if err != nil {
		t.Fatalf("re-adding removed n4: %v", err)
	}
	if nid := added.GetMember().GetId(); nid == id || nid == 0 {
		t.Errorf("n4 added again under raft id %x (its old id %x)", nid, id)
	}
	for i := range 3 {
		eventually(t, 10*time.Second, fmt.Sprintf("n%d takes n4's new id", i+1), func() bool { return c.Node(i).AcceptsPeer(added.GetMember().GetId()) })
		if c.Node(i).AcceptsPeer(id) {
			t.Errorf("n%d accepts messages from n4's retired id again", i+1)
		}
	}
}

// TestRemoveLeaderTransfersLeadership removes the leader: it hands leadership over first, then the new
// leader removes it, and the old leader stops.
func TestRemoveLeaderTransfersLeadership(t *testing.T) {
	c := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	old := c.WaitLeader()
	id := c.Node(old).ID()
	_, err := leasepb.NewClusterClient(c.Conn(old)).MemberRemove(ctx, &leasepb.MemberRemoveRequest{Id: id})
	st, _ := status.FromError(err)
	if st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "leadership handed") {
		t.Fatalf("removing the leader at the leader: %v, want Unavailable after a hand-over", err)
	}
	next := c.WaitLeader()
	if next == old {
		t.Fatal("leadership did not move")
	}
	if _, err := leasepb.NewClusterClient(c.Conn(next)).MemberRemove(ctx, &leasepb.MemberRemoveRequest{Id: id}); err != nil {
		t.Fatalf("member remove at the new leader: %v", err)
	}
	select {
	case <-c.Node(old).Done():
	case <-time.After(15 * time.Second):
		t.Fatal("the removed leader did not stop")
	}
	// Two voters left: removing one of them would leave one, fine; removing down to zero is refused.
	if _, err := leasepb.NewClusterClient(c.Conn(next)).MemberRemove(ctx, &leasepb.MemberRemoveRequest{Id: 99}); status.Code(err) != codes.NotFound {
		t.Errorf("remove of an unknown member: %v, want NotFound", err)
	}
}

// TestRemoveLastVoterRefused: a one-node cluster cannot remove its only voter.
func TestRemoveLastVoterRefused(t *testing.T) {
	c := servertest.Start(t, 1, nil)
	_, err := leasepb.NewClusterClient(c.Conn(0)).MemberRemove(ctxT(t), &leasepb.MemberRemoveRequest{Id: c.Node(0).ID()})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "last voter") {
		t.Fatalf("removing the last voter: %v, want FailedPrecondition naming the last voter", err)
	}
}

// TestIdleLearnersArePromoted adds learners to a cluster that takes no writes, one after another, and wants
// each promoted promptly. An idle learner answers only heartbeats, and the leader sampled its RecentActive
// once per election timeout, in step with raft's quorum check that clears it: one such learner stayed
// unpromoted for 51 s in a soak (and 20 s in one of five runs of this shape).
func TestIdleLearnersArePromoted(t *testing.T) {
	c := servertest.Start(t, 3, verboseLogs(t))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, name := range []string{"n4", "n5", "n6"} {
		leader := c.WaitLeader()
		lis := listeners(t)
		add, err := leasepb.NewClusterClient(c.Conn(leader)).MemberAdd(ctx, &leasepb.MemberAddRequest{Name: name, PeerAddr: lis.Peer.Addr().String()})
		if err != nil {
			t.Fatalf("member add %s: %v", name, err)
		}
		j := startJoiner(t, c, name, lis)
		start := time.Now()
		// Five election timeouts caught up are needed; ten seconds is twenty times that.
		eventually(t, 10*time.Second, name+" promoted", func() bool {
			m := memberNamed(members(t, c, c.WaitLeader()), name)
			return m != nil && !m.GetIsLearner()
		})
		t.Logf("%s promoted %v after it started", name, time.Since(start).Round(time.Millisecond))
		if _, err := leasepb.NewClusterClient(c.Conn(c.WaitLeader())).MemberRemove(ctx, &leasepb.MemberRemoveRequest{Id: add.GetMember().GetId()}); err != nil {
			t.Fatalf("member remove %s: %v", name, err)
		}
		select {
		case <-j.srv.Done():
		case <-time.After(15 * time.Second):
			t.Fatalf("removed %s did not stop", name)
		}
	}
}

// TestMemberJoinsWithPeerTLS adds a member to a cluster whose peers speak mutual TLS. The joining node
// has applied no configuration yet, so it cannot look its peers' names up; their certificates name them
// and also localhost (as testcerts' node certificates, and most real ones, do), and the joiner must still
// take the leader's stream. It refused every peer as "naming several members" when any name counted as
// a member before the first configuration (found by the chaos run TLS=1 MEMBERSHIP=1).
func TestMemberJoinsWithPeerTLS(t *testing.T) {
	ca := testcerts.NewCA(t, "ca")
	c := servertest.StartTLS(t, 3, ca, verboseLogs(t))
	ctx := ctxT(t)
	lis := listeners(t)
	add, err := leasepb.NewClusterClient(c.Conn(c.WaitLeader())).MemberAdd(ctx, &leasepb.MemberAddRequest{Name: "n4", PeerAddr: lis.Peer.Addr().String()})
	if err != nil {
		t.Fatalf("member add: %v", err)
	}
	j := startJoinerWith(t, c, "n4", lis, func(cfg *server.Config) {
		node := ca.Node(t, cfg.Name)
		cfg.PeerTLS = testcerts.MutualConfig(node, ca)
		cfg.ClientTLS = testcerts.ServerConfig(node, ca.Pool())
		cfg.ClientCertAuth = true
	}, credentials.NewTLS(testcerts.ClientConfig(ca.Client(t, "servertest"), ca.Pool())))
	eventually(t, 30*time.Second, "n4 promoted", func() bool {
		m := memberNamed(members(t, c, c.WaitLeader()), "n4")
		return m != nil && !m.GetIsLearner() && m.GetId() == add.GetMember().GetId()
	})
	eventually(t, 10*time.Second, "n4 applied the cluster's entries", func() bool {
		return j.srv.AppliedIndex() >= c.Node(c.WaitLeader()).AppliedIndex()
	})
}
