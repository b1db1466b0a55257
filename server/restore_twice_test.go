package server_test

import (
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest"
)

// incarnation is one cluster's life: the tokens it granted, in grant order.
type incarnation struct {
	name   string
	tokens []uint64
}

// checkIncarnations is the promise of decision 12 across restores (I1): every token an incarnation
// grants is above every token granted by the incarnations before it, so no token is issued twice and
// none goes backwards, whatever an operator restored from what.
func checkIncarnations(incs []incarnation) []string {
	var bad []string
	var top uint64
	above := ""
	for _, inc := range incs {
		var prev uint64
		for _, tok := range inc.tokens {
			if tok <= top {
				bad = append(bad, fmt.Sprintf("%s granted token %d, not above %d granted by %s", inc.name, tok, top, above))
			}
			if tok <= prev {
				bad = append(bad, fmt.Sprintf("%s granted token %d after %d", inc.name, tok, prev))
			}
			prev = tok
		}
		if prev > top {
			top, above = prev, inc.name
		}
	}
	return bad
}

func TestCheckIncarnationsCatchesReissuedTokens(t *testing.T) {
	ok := []incarnation{{"a", []uint64{3, 4}}, {"b", []uint64{10, 11}}, {"c", []uint64{12}}}
	if bad := checkIncarnations(ok); len(bad) > 0 {
		t.Fatalf("increasing incarnations reported: %v", bad)
	}
	for _, incs := range [][]incarnation{
		{{"a", []uint64{3, 4}}, {"b", []uint64{4, 5}}}, // a token reissued
		{{"a", []uint64{10}}, {"b", []uint64{20}}, {"c", []uint64{15}}},
		{{"a", []uint64{5, 5}}},
	} {
		if bad := checkIncarnations(incs); len(bad) == 0 {
			t.Fatalf("%v passed", incs)
		}
	}
}

// restoredNode restores data into a new single-node cluster named r1 at peer address peer, with the
// default token floor, and starts it.
func restoredNode(t *testing.T, data []byte, peer string) (*server.Server, server.RestoreInfo) {
	t.Helper()
	cfg := server.TestConfig()
	peerLis, err := net.Listen("tcp", peer) // the same --initial-cluster for every restore
	if err != nil {
		t.Fatal(err)
	}
	lis := server.Listeners{Client: listenLocal(t), Peer: peerLis}
	cfg.Name, cfg.DataDir = "r1", filepath.Join(t.TempDir(), "r1")
	cfg.ClientAddr, cfg.PeerAddr = lis.Client.Addr().String(), peer
	cfg.InitialCluster = map[string]string{"r1": peer}
	info, err := server.RestoreDataDir(server.RestoreConfig{Snapshot: data, Name: "r1", DataDir: cfg.DataDir, InitialCluster: cfg.InitialCluster})
	if err != nil {
		t.Fatal(err)
	}
	if !info.DefaultFloor {
		t.Fatalf("restore without a floor: %+v", info)
	}
	s, err := server.New(cfg, lis)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() { _ = s.Close() })
	eventually(t, 5*time.Second, "restored node leads", s.IsLeader)
	return s, info
}

// grantFresh acquires n resources no earlier incarnation held and returns their tokens in grant order.
func grantFresh(t *testing.T, s *server.Server, tag string, n int) []uint64 {
	t.Helper()
	cl := dial(t, s.ClientAddr())
	toks := make([]uint64, 0, n)
	for i := range n {
		resp, err := cl.Acquire(ctxT(t), &leasepb.AcquireRequest{Resource: fmt.Sprintf("%s/%d", tag, i), Holder: tag, TtlMs: 60_000})
		if err != nil {
			t.Fatalf("%s: acquire: %v", tag, err)
		}
		toks = append(toks, resp.GetLease().GetToken())
	}
	return toks
}

// lineageOf decodes a backup's cluster id and generation.
func lineageOf(t *testing.T, data []byte) (cluster, generation uint64) {
	t.Helper()
	sm, err := fsm.Restore(data)
	if err != nil {
		t.Fatal(err)
	}
	return sm.ClusterID(), sm.Generation()
}

// TestRestoringTwiceNeverReissuesTokens is an operator's bad week: a cluster is backed up twice and lost
// after granting more; its newer backup is restored, the restored cluster grants, is backed up and lost
// before anyone notices; the same backup is restored again, then the older one; then the restored
// cluster's backup, twice. Every restore takes the default floor and the same --initial-cluster, and
// every incarnation grants only tokens above all tokens granted before it. (A floor that is a function
// of the file alone gives the second restore of a file the first one's tokens, and an older file a lower
// floor; a floor of max(index + 2^40, clock) gives two restores of the restored cluster's backup, whose
// index + 2^40 is above the clock, the same floor.)
func TestRestoringTwiceNeverReissuesTokens(t *testing.T) {
	cfg := server.TestConfig()
	old := startSingleNode(t, &cfg)
	incs := []incarnation{{name: "the original cluster", tokens: grantFresh(t, old, "o1", 2)}}
	older, _ := backup(t, old.ClientAddr())
	incs[0].tokens = append(incs[0].tokens, grantFresh(t, old, "o2", 2)...)
	newer, _ := backup(t, old.ClientAddr())
	incs[0].tokens = append(incs[0].tokens, grantFresh(t, old, "o3", 3)...) // unknown to both backups
	if id, gen := lineageOf(t, newer); id == 0 || gen != 0 {
		t.Fatalf("a backup of a cluster founded by flags records cluster %016x generation %d, want its id and 0", id, gen)
	}
	_ = old.Close()

	addr := servertest.FreeAddrs(t, 1)[0] // below the ephemeral range: free for every restore in turn

	var restoredBackup []byte
	var ids []uint64
	for i, step := range []struct {
		name string
		data func() []byte
		gen  uint64
	}{
		{"the newer backup restored", func() []byte { return newer }, 1},
		{"the newer backup restored again", func() []byte { return newer }, 1},
		{"the older backup restored", func() []byte { return older }, 1},
		{"the first restored cluster's backup restored", func() []byte { return restoredBackup }, 2},
		{"the first restored cluster's backup restored again", func() []byte { return restoredBackup }, 2},
	} {
		s, info := restoredNode(t, step.data(), addr)
		if info.Generation != step.gen {
			t.Errorf("%s: generation %d, want %d", step.name, info.Generation, step.gen)
		}
		ids = append(ids, info.ClusterID)
		incs = append(incs, incarnation{name: step.name, tokens: grantFresh(t, s, fmt.Sprintf("r%d", i), 3)})
		if i == 0 {
			restoredBackup, _ = backup(t, s.ClientAddr())
			if id, gen := lineageOf(t, restoredBackup); id != info.ClusterID || gen != 1 {
				t.Fatalf("a backup of the restored cluster %016x records cluster %016x generation %d, want generation 1",
					info.ClusterID, id, gen)
			}
			// Granted after the backup: the restores of that backup must not reissue these either.
			incs[len(incs)-1].tokens = append(incs[len(incs)-1].tokens, grantFresh(t, s, "r0-late", 2)...)
		}
		_ = s.Close() // lost
	}
	for _, v := range checkIncarnations(incs) {
		t.Error(v)
	}
	seen := map[uint64]bool{}
	for _, id := range ids {
		if seen[id] {
			t.Errorf("two restores into the same --initial-cluster made clusters with the same id %016x", id)
		}
		seen[id] = true
	}
	if t.Failed() {
		t.Logf("incarnations: %v", incs)
	}
}
