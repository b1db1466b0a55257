package server_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest"
)

// backup streams a snapshot from addr and checks the chunks' contract: at most 1 MiB each, the applied
// index on every one, remaining_bytes counting down to 0, the sha256 of the whole on the last only.
func backup(t *testing.T, addr string) ([]byte, uint64) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := leasepb.NewClusterClient(conn).Snapshot(ctxT(t), &leasepb.SnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var data []byte
	var index uint64
	for {
		chunk, err := stream.Recv()
		if err != nil {
			t.Fatalf("snapshot stream: %v", err)
		}
		if len(chunk.GetData()) > 1<<20 || chunk.GetAppliedIndex() == 0 {
			t.Fatalf("chunk of %d bytes at index %d", len(chunk.GetData()), chunk.GetAppliedIndex())
		}
		data, index = append(data, chunk.GetData()...), chunk.GetAppliedIndex()
		if chunk.GetRemainingBytes() > 0 {
			if chunk.GetSha256() != nil {
				t.Fatal("sha256 on a chunk before the last")
			}
			continue
		}
		if sum := sha256.Sum256(data); !bytes.Equal(sum[:], chunk.GetSha256()) {
			t.Fatalf("sha256 %x, the server says %x", sum, chunk.GetSha256())
		}
		if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
			t.Fatalf("after the last chunk: %v", err)
		}
		return data, index
	}
}

// TestSnapshotsReleaseTheirViews: the views a node takes for its own snapshots and for a backup are
// released once encoded, so the state machine goes back to changing leases in place (fsm.View).
func TestSnapshotsReleaseTheirViews(t *testing.T) {
	c := servertest.Start(t, 3, func(cfg *server.Config) { cfg.SnapshotEntries, cfg.SnapshotCatchUp = 20, 5 })
	ctx := ctxT(t)
	for i := range 60 {
		if _, err := acquireRetrying(c, ctx, &leasepb.AcquireRequest{Resource: fmt.Sprintf("v/%d", i), Holder: "h", TtlMs: 60_000, RequestId: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	backup(t, c.Node(c.WaitLeader()).ClientAddr())
	for n := range c.Size() {
		s := c.Node(n)
		eventually(t, 10*time.Second, fmt.Sprintf("node %d releases its views", n), func() bool { return s.LiveViews() == 0 })
		if s.LogFirstIndex() <= 1 {
			t.Fatalf("node %d took no snapshot: its log still starts at %d", n, s.LogFirstIndex())
		}
	}
}

// TestSnapshotRestoreStartsAboveTheFloor backs up a node, restores the backup into a new single-node
// cluster with a token floor, and checks the new cluster holds every lease and grants above the floor.
func TestSnapshotRestoreStartsAboveTheFloor(t *testing.T) {
	cfg := server.TestConfig()
	old := startSingleNode(t, &cfg)
	cl := dial(t, old.ClientAddr())
	held := map[string]*leasepb.Lease{}
	for _, r := range []string{"a", "b", "c"} {
		resp, err := cl.Acquire(ctxT(t), &leasepb.AcquireRequest{Resource: r, Holder: "h-" + r, TtlMs: 60_000, Value: []byte("v-" + r), RequestId: "q-" + r})
		if err != nil {
			t.Fatal(err)
		}
		held[r] = resp.GetLease()
	}
	data, index := backup(t, old.ClientAddr())
	if index < held["c"].GetToken() {
		t.Fatalf("backup at index %d misses the grant at %d (not a linearizable read)", index, held["c"].GetToken())
	}
	if sm, err := fsm.Restore(data); err != nil || sm.Len() != 3 || sm.AppliedIndex() != index {
		t.Fatalf("backup decodes to %v leases at %v: %v", sm.Len(), sm.AppliedIndex(), err)
	}

	newCfg := server.TestConfig()
	lis := server.Listeners{Client: listenLocal(t), Peer: listenLocal(t)}
	newCfg.Name, newCfg.DataDir = "r1", filepath.Join(t.TempDir(), "r1")
	newCfg.ClientAddr, newCfg.PeerAddr = lis.Client.Addr().String(), lis.Peer.Addr().String()
	newCfg.InitialCluster = map[string]string{"r1": newCfg.PeerAddr}
	floor := index + 10_000
	info, err := server.RestoreDataDir(server.RestoreConfig{Snapshot: data, Name: "r1", DataDir: newCfg.DataDir,
		InitialCluster: newCfg.InitialCluster, TokenFloor: floor})
	if err != nil {
		t.Fatal(err)
	}
	if info.TokenFloor != floor || info.Leases != 3 || info.AppliedIndex != index {
		t.Fatalf("restore info = %+v", info)
	}
	s, err := server.New(newCfg, lis)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() { _ = s.Close() })
	eventually(t, 5*time.Second, "restored node leads", s.IsLeader)
	ncl := dial(t, s.ClientAddr())
	for r, want := range held {
		got, err := ncl.Get(ctxT(t), &leasepb.GetRequest{Resource: r})
		if err != nil {
			t.Fatalf("get %s: %v", r, err)
		}
		l := got.GetLease()
		if l.GetToken() != want.GetToken() || l.GetHolder() != want.GetHolder() || string(l.GetValue()) != string(want.GetValue()) {
			t.Fatalf("restored %s = %v, want %v", r, l, want)
		}
	}
	// A retry of an acquire from before the backup returns the same grant (the dedup record came along).
	again, err := ncl.Acquire(ctxT(t), &leasepb.AcquireRequest{Resource: "a", Holder: "h-a", TtlMs: 60_000, RequestId: "q-a", Value: held["a"].GetValue()})
	if err != nil || again.GetLease().GetToken() != held["a"].GetToken() {
		t.Fatalf("retried acquire = %v, %v", again.GetLease(), err)
	}
	fresh, err := ncl.Acquire(ctxT(t), &leasepb.AcquireRequest{Resource: "new", Holder: "h", TtlMs: 60_000})
	if err != nil {
		t.Fatal(err)
	}
	if tok := fresh.GetLease().GetToken(); tok <= floor {
		t.Fatalf("first token after restore %d, want above the floor %d", tok, floor)
	}
}
