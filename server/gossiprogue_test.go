package server_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/raftlog"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest"
)

// rogueMeta is a memberlist delegate that gossips made-up metadata.
type rogueMeta struct{ meta []byte }

func (r rogueMeta) NodeMeta(int) []byte                  { return r.meta }
func (rogueMeta) NotifyMsg([]byte)                       {}
func (rogueMeta) GetBroadcasts(int, int) [][]byte        { return nil }
func (rogueMeta) LocalState(bool) []byte                 { return nil }
func (rogueMeta) MergeRemoteState(buf []byte, join bool) {}

// startRogueGossip runs a gossip member that is no node, gossiping meta, and joins it to join (if any).
func startRogueGossip(t *testing.T, meta *wirepb.GossipMeta, join ...string) (*memberlist.Memberlist, string) {
	t.Helper()
	raw, err := proto.Marshal(meta)
	if err != nil {
		t.Fatal(err)
	}
	addr := servertest.FreeAddrs(t, 1)[0]
	host, p, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(p)
	mc := memberlist.DefaultLocalConfig()
	mc.Name, mc.BindAddr, mc.BindPort, mc.AdvertisePort = meta.GetName(), host, port, port
	mc.Delegate, mc.LogOutput = rogueMeta{raw}, testWriter{t}
	ml, err := memberlist.Create(mc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ml.Shutdown() })
	if len(join) > 0 {
		if _, err := ml.Join(join); err != nil {
			t.Fatal(err)
		}
	}
	return ml, addr
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	if testing.Verbose() {
		w.t.Log(string(p))
	}
	return len(p), nil
}

// rogueJoin answers every Join as a member of a cluster of its own making.
type rogueJoin struct {
	wirepb.UnimplementedRaftServer
	cluster uint64
}

func (r rogueJoin) Join(_ context.Context, req *wirepb.JoinRequest) (*wirepb.JoinResponse, error) {
	m := &leasepb.Member{Id: rogueMemberID(r.cluster, req.GetName()), Name: req.GetName(), PeerAddr: "127.0.0.1:1"}
	return &wirepb.JoinResponse{ClusterId: r.cluster, Member: m, Members: []*leasepb.Member{m}}, nil
}

// rogueMemberID is the raft id a node named name has in cluster (server/identity.go): a rogue computes
// it as easily as a member, so the joiner's own check of it proves nothing.
func rogueMemberID(cluster uint64, name string) uint64 {
	var buf [8]byte
	binary.BigEndian.PutUint64(buf[:], cluster)
	sum := sha256.Sum256([]byte("member:" + string(buf[:]) + name))
	return max(binary.BigEndian.Uint64(sum[:8]), 1)
}

// A joining node that finds the cluster through unencrypted gossip, where a rogue member gossips a peer
// address that answers for a cluster 0xbad of its making: the joiner refuses that cluster, since its
// --initial-cluster-token names another, and writes nothing into its data dir.
func TestRogueGossipCannotCaptureAJoiner(t *testing.T) {
	skipShort(t)
	peer, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rogueSrv := grpc.NewServer()
	wirepb.RegisterRaftServer(rogueSrv, rogueJoin{cluster: 0xbad})
	go func() { _ = rogueSrv.Serve(peer) }()
	t.Cleanup(rogueSrv.Stop)
	_, rogueAddr := startRogueGossip(t, &wirepb.GossipMeta{Name: "rogue", Id: 7, ClusterId: 0xbad, PeerAddr: peer.Addr().String()})

	addrs := servertest.FreeAddrs(t, 3)
	cfg := server.TestConfig()
	cfg.Name, cfg.DataDir = "n4", filepath.Join(t.TempDir(), "n4")
	cfg.ClientAddr, cfg.PeerAddr, cfg.GossipAddr = addrs[0], addrs[1], addrs[2]
	cfg.InitialClusterState, cfg.Join, cfg.InitialClusterToken = server.ClusterStateExisting, []string{rogueAddr}, "the-real-cluster"
	cfg.JoinTimeout = 2 * time.Second
	srv, err := server.New(cfg, server.Listeners{})
	if err == nil {
		_ = srv.Close()
		t.Fatal("the joiner accepted the rogue's cluster")
	}
	t.Logf("refused: %v", err)
	if id, ok, err := raftlog.ReadIdentity(cfg.DataDir); ok || err != nil {
		t.Fatalf("the joiner's data dir records %v (%v)", id, err)
	}
}

// A rogue gossip member claiming to be a member that was added but has not started yet, with a client
// address of its own: no node hands that address to clients, since it is not in the member table.
func TestGossipClientAddressIsOnlyAHint(t *testing.T) {
	gossipAddrs := servertest.FreeAddrs(t, 3)
	i := 0
	c := servertest.Start(t, 3, func(cfg *server.Config) {
		cfg.GossipAddr = gossipAddrs[i]
		i++
	})
	li := c.WaitLeader()
	add, err := leasepb.NewClusterClient(c.Conn(li)).MemberAdd(ctxT(t), &leasepb.MemberAddRequest{Name: "n4", PeerAddr: servertest.FreeAddrs(t, 1)[0]})
	if err != nil {
		t.Fatal(err)
	}
	st, err := leasepb.NewClusterClient(c.Conn(li)).Status(ctxT(t), &leasepb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	const fake = "127.0.0.1:1"
	rogue, _ := startRogueGossip(t, &wirepb.GossipMeta{Name: "n4", Id: add.GetMember().GetId(),
		ClusterId: st.GetHeader().GetClusterId(), ClientAddr: fake, PeerAddr: add.GetMember().GetPeerAddr()}, gossipAddrs...)
	eventually(t, 10*time.Second, "the rogue to be known to every node's gossip", func() bool { return rogue.NumMembers() == 4 })
	// The joins exchanged the full state both ways: every node's gossip now carries the rogue's address.
	// A follower lists n4 once it has applied the MemberAdd (its list is serializable): wait for that.
	for n := range c.Size() {
		var m *leasepb.Member
		eventually(t, 10*time.Second, fmt.Sprintf("node %d to list n4", n), func() bool {
			m = memberNamed(members(t, c, n), "n4")
			return m != nil
		})
		if m.GetClientAddr() == fake {
			t.Fatalf("node %d lists n4 as %v", n, m)
		}
	}
}
