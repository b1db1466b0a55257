package server_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest/testcerts"
)

// TestRandomPeerInputFromAMemberNeverWedges: a member's credential (a real member certificate, speaking
// as that member, so the transport lets every message through to the checks) sends a seeded stream of
// random and adversarial raft messages to the other nodes — terms near every bound, bogus snapshots,
// commit indexes past the log, votes, transfers, read-index answers — while a client takes grants.
// After it, no node has stopped, the cluster grants again within 15 s, and every grant it acknowledged
// is still held with its token. LEASED_PEER_SEED replays a run; LEASED_PEER_ROUNDS makes it longer.
//
// Not in the stream: entries a member appends as the leader of a term it names itself, and a well-formed
// state it sends while it leads. Raft cannot tell them from a real leader's (it trusts its members to
// follow the protocol); the checks bound what a member can do to terms, indexes and snapshots, not what
// a leader may write.
func TestRandomPeerInputFromAMemberNeverWedges(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("LEASED_PEER_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("LEASED_PEER_SEED: %v", err)
		}
	}
	rounds := 40
	if s := os.Getenv("LEASED_PEER_ROUNDS"); s != "" {
		var err error
		if rounds, err = strconv.Atoi(s); err != nil || rounds < 1 || rounds > 10_000 {
			t.Fatalf("LEASED_PEER_ROUNDS=%q: want 1..10000", s)
		}
	}
	t.Logf("seed %d (LEASED_PEER_SEED=%d replays it), %d rounds", seed, seed, rounds)
	rng := rand.New(rand.NewPCG(seed, 0x9ee7))

	ca := testcerts.NewCA(t, "ca")
	pc := startPeerCluster(t, ca)
	li := pc.WaitLeader()
	x := rng.IntN(pc.Size()) // the member whose credential sends the stream
	creds := testcerts.MutualConfig(ca.Node(t, fmt.Sprintf("n%d", x+1)), ca)
	f := &forger{rng: rng, from: pc.Node(x).ID()}
	for i := range pc.Size() {
		f.voters = append(f.voters, pc.Node(i).ID())
	}
	slices.Sort(f.voters)
	f.state, f.applied = backupConn(t, pc, li)

	acked := map[string]uint64{}
	for r := range rounds {
		target := (x + 1 + rng.IntN(pc.Size()-1)) % pc.Size()
		n := pc.Node(target)
		msgs := make([]*raftpb.Message, 1+rng.IntN(4))
		for i := range msgs {
			msgs[i] = f.message(t, n)
		}
		_ = forgeLink(t, n.PeerAddr(), creds, batch(t, pc.cluster, f.from, n.ID(), msgs...)) // refused or dropped: what matters is what follows
		pc.running(t, fmt.Sprintf("round %d", r))
		resource := fmt.Sprintf("grant/%d", r)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := acquireRetrying(pc.Cluster, ctx, &leasepb.AcquireRequest{Resource: resource, Holder: "h", TtlMs: 600_000, RequestId: resource})
		cancel()
		if err == nil {
			acked[resource] = resp.GetLease().GetToken()
		}
	}
	pc.recovers(t, "the forged stream")
	for resource, token := range acked {
		resp, err := retrying(pc.Cluster, ctxT(t), func(ctx context.Context, cl leasepb.LeasesClient) (*leasepb.GetResponse, error) {
			return cl.Get(ctx, &leasepb.GetRequest{Resource: resource})
		})
		if err != nil || resp.GetLease().GetToken() != token || resp.GetLease().GetHolder() != "h" {
			t.Errorf("acknowledged grant of %s (token %d) is not intact: %v, %v", resource, token, resp.GetLease(), err)
		}
	}
	t.Logf("%d of %d grants acknowledged, all intact", len(acked), rounds)
}

// forger makes random and adversarial raft messages from one member.
type forger struct {
	rng     *rand.Rand
	from    uint64
	voters  []uint64
	state   []byte // a real state, to forge well-formed snapshots from
	applied uint64
}

var forgedTypes = []raftpb.MessageType{
	raftpb.MsgApp, raftpb.MsgAppResp, raftpb.MsgVote, raftpb.MsgVoteResp, raftpb.MsgPreVote, raftpb.MsgPreVoteResp,
	raftpb.MsgSnap, raftpb.MsgSnap, raftpb.MsgHeartbeat, raftpb.MsgHeartbeat, raftpb.MsgHeartbeatResp,
	raftpb.MsgTransferLeader, raftpb.MsgTimeoutNow, raftpb.MsgReadIndex, raftpb.MsgReadIndexResp,
	raftpb.MsgHup, raftpb.MsgProp, raftpb.MsgStorageAppend, // local types: never from a peer
}

// term is near one of the bounds: the receiver's own, the next, its allowance, the old and new ceilings,
// the top of the range; or anything.
func (f *forger) term(own uint64) uint64 {
	switch f.rng.IntN(11) {
	case 0:
		return 0
	case 1:
		return max(own, 1) - 1
	case 2:
		return own
	case 3:
		return own + 1
	case 4, 5:
		return own + 1<<32 - 1 + f.rng.Uint64N(3)
	case 6:
		return 1<<62 - 1 + f.rng.Uint64N(3)
	case 7:
		return 1<<63 - 1 + f.rng.Uint64N(3)
	case 8:
		return math.MaxUint64 - f.rng.Uint64N(2)
	default:
		return f.rng.Uint64()
	}
}

// pastLog is an index past the receiver's log (0 sometimes).
func (f *forger) pastLog(last uint64) uint64 {
	switch f.rng.IntN(6) {
	case 0:
		return 0
	case 1:
		return last + 1
	case 2:
		return last + 1<<20
	case 3:
		return 1<<63 - f.rng.Uint64N(2)
	case 4:
		return math.MaxUint64
	default:
		return last + 1 + f.rng.Uint64N(1<<40)
	}
}

// boundTerms are the terms next to a bound: the next election's, the edges of the allowance, the
// ceilings of old and now, the top of the range.
func boundTerms(own uint64) []uint64 {
	return []uint64{own + 1, own + 1<<32 - 1, own + 1<<32, own + 1<<32 + 1, 1<<62 - 1, 1 << 62, 1<<63 - 1, 1 << 63, math.MaxUint64}
}

func (f *forger) message(t *testing.T, n *server.Server) *raftpb.Message {
	own, last := n.Term(), n.LogLastIndex()
	if f.rng.IntN(3) == 0 {
		// A term probe: a heartbeat that passes every other check, at a term next to a bound.
		terms := boundTerms(own)
		return heartbeat(terms[f.rng.IntN(len(terms))], 0)
	}
	term, logTerm := f.term(own), f.term(own)
	m := &raftpb.Message{
		Type: forgedTypes[f.rng.IntN(len(forgedTypes))].Enum(), Term: &term, LogTerm: &logTerm,
		Index: new(f.pastLog(last)), Commit: new(f.pastLog(last)), Reject: new(f.rng.IntN(2) == 0),
		RejectHint: new(f.pastLog(last)),
	}
	switch m.GetType() {
	case raftpb.MsgApp:
		// Entries after an index past the log: raft refuses to append them, and nothing commits.
		for i := range uint64(f.rng.IntN(3)) {
			m.Entries = append(m.Entries, &raftpb.Entry{Index: new(m.GetIndex() + 1 + i), Term: new(term), Type: raftpb.EntryNormal.Enum()})
		}
	case raftpb.MsgReadIndex, raftpb.MsgReadIndexResp:
		m.Entries = []*raftpb.Entry{{Data: binaryUint64(f.rng.Uint64())}}
	case raftpb.MsgSnap:
		// A well-formed state only in a term whose leader the receiver knows is another member: the
		// leader's own credential may send any state (a member that leads is trusted to follow raft).
		leader, now := n.Leader(), n.Term()
		wellFormed := now == own && leader != 0 && leader != f.from
		if wellFormed {
			term = own
		}
		m.Snapshot = f.snapshot(t, term, wellFormed)
	case raftpb.MsgHeartbeat, raftpb.MsgHeartbeatResp:
		m.Context = make([]byte, f.rng.IntN(10)) // a read-index round is 8 bytes
	}
	return m
}

// snapshot is garbage, empty, or a well-formed state with an extra lease, with metadata that fits it
// or not.
func (f *forger) snapshot(t *testing.T, term uint64, wellFormed bool) *raftpb.Snapshot {
	at := f.applied + 1 + f.rng.Uint64N(5000)
	voters := f.voters
	var data []byte
	kind := f.rng.IntN(5)
	if !wellFormed {
		kind %= 2
	}
	switch kind {
	case 0:
		data = []byte("LEASEDSN garbage")
	case 1:
	case 2:
		data = forgedState(t, f.state, at)
		at++ // metadata past the state
	case 3:
		data = forgedState(t, f.state, at)
		voters = append(slices.Clone(voters), 0xBAD) // a configuration that is not the table's
	default:
		data = forgedState(t, f.state, at)
	}
	snapTerm := min(term, f.term(term))
	return &raftpb.Snapshot{Data: data, Metadata: &raftpb.SnapshotMetadata{Index: &at, Term: &snapTerm, ConfState: &raftpb.ConfState{Voters: voters}}}
}

func binaryUint64(v uint64) []byte { return []byte(strconv.FormatUint(v, 16)) }

// backupConn is the state of node i, as the Snapshot RPC streams it, and its applied index.
func backupConn(t *testing.T, pc *peerCluster, i int) ([]byte, uint64) {
	t.Helper()
	stream, err := leasepb.NewClusterClient(pc.Conn(i)).Snapshot(ctxT(t), &leasepb.SnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var data []byte
	for {
		chunk, err := stream.Recv()
		if err != nil {
			t.Fatalf("snapshot stream: %v", err)
		}
		data = append(data, chunk.GetData()...)
		if chunk.GetRemainingBytes() == 0 {
			return data, chunk.GetAppliedIndex()
		}
	}
}
