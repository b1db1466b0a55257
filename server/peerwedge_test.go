package server_test

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/fsm"
)

// Forged raft messages that used to leave a cluster without a leader, or a node unable to start, for
// good: a heartbeat at a term near the top of the range (every later election's term was refused), and a
// MsgSnap whose data does not decode (persisted before it was read) or that a member other than the
// leader sent (adopted). Plaintext loopback peer ports, as scripts/cluster.sh runs them: anyone on the
// host can send these.

// recovers checks that no node stopped and that the cluster grants again within 15 s: a leader elected
// and committing.
func (pc *peerCluster) recovers(t *testing.T, what string) {
	t.Helper()
	pc.running(t, what)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	resource := "after/" + strings.NewReplacer(" ", "-", "^", "_", "'", "").Replace(what)
	if _, err := acquireRetrying(pc.Cluster, ctx, &leasepb.AcquireRequest{Resource: resource, Holder: "h", TtlMs: 600_000, RequestId: resource}); err != nil {
		t.Fatalf("after %s: no grant within 15 s: %v", what, err)
	}
	pc.running(t, what)
}

// running fails the test if a node stopped.
func (pc *peerCluster) running(t *testing.T, what string) {
	t.Helper()
	for i := range pc.Size() {
		if n := pc.Node(i); n != nil {
			select {
			case <-n.Done():
				t.Fatalf("after %s: node %d stopped: %v", what, i, n.Err())
			default:
			}
		}
	}
}

// restartAll stops every node, then starts them all again on their data dirs.
func (pc *peerCluster) restartAll(t *testing.T) {
	t.Helper()
	for i := range pc.Size() {
		pc.Stop(i)
	}
	for i := range pc.Size() {
		pc.restart(t, i)
	}
}

func (pc *peerCluster) restart(t *testing.T, i int) {
	t.Helper()
	reg := prometheus.NewRegistry()
	pc.regs[i] = reg
	pc.SetRegisterer(i, reg)
	pc.Restart(i)
}

// forge sends msgs to node i's peer port as the member from, on a raft link.
func (pc *peerCluster) forge(t *testing.T, i int, from uint64, msgs ...*raftpb.Message) {
	t.Helper()
	target := pc.Node(i)
	if err := forgeLink(t, target.PeerAddr(), nil, batch(t, pc.cluster, from, target.ID(), msgs...)); err != nil {
		t.Fatalf("forge to node %d: %v", i, err)
	}
}

// A forged heartbeat at any term, from the leader's id to a follower: the cluster has a leader again
// within 15 s, also after every node restarted. The terms far ahead are dropped and counted; those within
// a node's allowance are taken, and the cluster elects at the next term.
func TestForgedHeartbeatAtAnyTermLeavesALeader(t *testing.T) {
	pc := startPeerCluster(t, nil)
	for _, probe := range []struct {
		name string
		term func(own uint64) uint64
		far  bool // must be dropped as too far ahead
	}{
		{"own+2^32-1", func(own uint64) uint64 { return own + 1<<32 - 1 }, false},
		{"own+2^32", func(own uint64) uint64 { return own + 1<<32 }, false},
		{"own+2^32+1", func(own uint64) uint64 { return own + 1<<32 + 1 }, false},
		{"2^62-1", func(uint64) uint64 { return 1<<62 - 1 }, true},
		{"2^62", func(uint64) uint64 { return 1 << 62 }, true},
		{"2^63-1", func(uint64) uint64 { return 1<<63 - 1 }, true},
		{"2^63", func(uint64) uint64 { return 1 << 63 }, true},
		{"2^64-1", func(uint64) uint64 { return math.MaxUint64 }, true},
	} {
		f := pc.Follower()
		leader := pc.Node(pc.WaitLeader()).ID()
		term := probe.term(pc.Node(f).Term())
		before := pc.dropped(t, f, "term")
		pc.forge(t, f, leader, heartbeat(term, 0))
		if probe.far {
			eventually(t, 10*time.Second, "the heartbeat at "+probe.name+" to be dropped as too far ahead", func() bool {
				return pc.dropped(t, f, "term") > before
			})
		}
		pc.recovers(t, probe.name)
	}
	pc.restartAll(t)
	pc.recovers(t, "restart")
	for i := range pc.Size() {
		if term := pc.Node(i).Term(); term >= 1<<40 {
			t.Fatalf("node %d is at term %d: a far term got in", i, term)
		}
	}
}

// Forged snapshots to a follower: garbage data, and well-formed states (an extra lease) that a member
// other than the leader sends, that disagree with their metadata, or that claim a term nobody reached; and
// a heartbeat in the current term from a member that is not its leader.
// Each is dropped as malformed; no node stops, the follower's state is what it was, also after a restart.
func TestForgedSnapshotsAreDropped(t *testing.T) {
	pc := startPeerCluster(t, nil)
	li, f := pc.WaitLeader(), pc.Follower()
	other := 3 - li - f
	leader, stranger := pc.Node(li).ID(), pc.Node(other).ID()
	data, applied := backup(t, pc.Node(li).ClientAddr())
	at := applied + 1000 // ahead of every log: raft would restore it
	forged := forgedState(t, data, at)
	var voters []uint64
	for i := range pc.Size() {
		voters = append(voters, pc.Node(i).ID())
	}
	slices.Sort(voters)
	term := pc.Node(f).Term()
	for _, c := range []struct {
		name string
		from uint64
		m    *raftpb.Message
	}{
		{"a heartbeat from a member that is not the leader", stranger, heartbeat(term, 0)},
		{"garbage data from the leader", leader, snapshotMsg(term, at, voters, []byte("not a snapshot"))},
		{"no data from the leader", leader, snapshotMsg(term, at, voters, nil)},
		{"a well-formed state from a member that is not the leader", stranger, snapshotMsg(term, at, voters, forged)},
		{"a well-formed state from a member claiming the next term", stranger, snapshotMsg(term+1, at, voters, forged)},
		{"a state at another index than its metadata's", leader, snapshotMsg(term, at+1, voters, forged)},
		{"a configuration that is not the member table", leader, snapshotMsg(term, at, append(slices.Clone(voters), 0xBAD), forged)},
	} {
		before := pc.dropped(t, f, "malformed")
		pc.forge(t, f, c.from, c.m)
		eventually(t, 10*time.Second, c.name+" to be dropped as malformed", func() bool {
			return pc.dropped(t, f, "malformed") > before
		})
		pc.running(t, c.name)
	}
	unchanged := func(when string) {
		t.Helper()
		n := pc.Node(f)
		if n.SnapshotsRestored() != 0 || n.HasLease("forged/lease") || n.AppliedIndex() >= at {
			t.Fatalf("%s: the follower took a forged snapshot: %d restored, applied index %d, forged lease %v",
				when, n.SnapshotsRestored(), n.AppliedIndex(), n.HasLease("forged/lease"))
		}
	}
	pc.recovers(t, "forged snapshots")
	unchanged("after the forged snapshots")
	pc.Stop(f)
	pc.restart(t, f)
	pc.recovers(t, "the follower's restart")
	unchanged("after a restart")
}

// forgedState is a well-formed state at index at: the backup data plus a lease nobody acquired.
func forgedState(t *testing.T, data []byte, at uint64) []byte {
	t.Helper()
	sm, err := fsm.Restore(data)
	if err != nil {
		t.Fatal(err)
	}
	cmd := &wirepb.Command{Op: &wirepb.Command_Acquire{Acquire: &wirepb.AcquireCmd{Resource: "forged/lease", Holder: "mallory", TtlMs: 3_600_000}}}
	if _, err := sm.Apply(sm.AppliedIndex()+1, cmd); err != nil {
		t.Fatal(err)
	}
	if _, ok := sm.Get("forged/lease"); !ok {
		t.Fatal("the forged state has no forged lease")
	}
	if err := sm.Advance(at); err != nil {
		t.Fatal(err)
	}
	out, err := sm.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func snapshotMsg(term, index uint64, voters []uint64, data []byte) *raftpb.Message {
	return &raftpb.Message{Type: raftpb.MsgSnap.Enum(), Term: &term, Snapshot: &raftpb.Snapshot{
		Metadata: &raftpb.SnapshotMetadata{Index: &index, Term: &term, ConfState: &raftpb.ConfState{Voters: voters}},
		Data:     data,
	}}
}
