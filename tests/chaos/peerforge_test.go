package chaos

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/wirepb"
)

// The peer-forge nemesis (runConfig.PeerForge, LEASED_CHAOS_PEERFORGE=1, make chaos PEERFORGE=1): a
// process on the host writes forged raft messages to one node's plaintext peer port, speaking as the
// leader or as another member, as anyone who reaches a loopback peer port can: heartbeats at terms far
// ahead (near 2^62, 2^63, 2^64, or 2^33 past the node's own), heartbeats committing past its log, and
// snapshots whose data is garbage or that a member other than the leader sends. The node drops them all,
// but a term 2^33 ahead that its allowance covers (it held its term for a second or more): that one it
// takes, and an election follows. Its promise, checked as the "peer-forge" checker: the node still runs
// afterwards, and the cluster has a leader within peerForgeBound; the other checkers stay at 0 (nothing
// forged reaches the state).
// TLS runs skip it: forging on a TLS peer port needs a member's certificate (server tests cover that).

// peerForgeBound is how long after a burst the cluster must have a leader again (scripts/cluster.sh's
// promise: a leader within 15 s).
const peerForgeBound = 15 * time.Second

// peerForgeWatch is how long after a burst the node must keep running.
const peerForgeWatch = 5 * time.Second

// peerForgeNemesis sends one burst of forged messages to a random node and checks what follows.
func (r *run) peerForgeNemesis(ctx context.Context, rng *rand.Rand, ld int) {
	if r.cfg.TLS || ld < 0 {
		r.stats.fault("peer-forge-skipped")
		return
	}
	target := rng.IntN(len(r.c.Nodes))
	st, err1 := r.c.Status(ctx, target)
	lst, err2 := r.c.Status(ctx, ld)
	if err1 != nil || err2 != nil {
		r.stats.fault("peer-forge-skipped")
		return
	}
	stranger := lst.GetId() // speak as the leader, or as a member that is not the leader
	if other := (target + 1 + rng.IntN(len(r.c.Nodes)-1)) % len(r.c.Nodes); other != ld && rng.IntN(2) == 0 {
		if ost, err := r.c.Status(ctx, other); err == nil {
			stranger = ost.GetId()
		}
	}
	id := r.faultStart("peer-forge", target)
	defer r.faultEnd(id)
	msgs := forgedBurst(rng, st.GetTerm(), st.GetCommitIndex(), st.GetId(), lst.GetId())
	err := forgePeerLink(r.c.Nodes[target].PeerAddr, st.GetHeader().GetClusterId(), stranger, st.GetId(), msgs)
	if err != nil {
		r.t.Logf("peer-forge: %v", err) // the node refused the link: nothing reached raft
	}
	_, _, werr := r.c.WaitLeader(peerForgeBound)
	// A node that took something it cannot use stops after the leader is back, and takes a few seconds
	// to exit (it drains its clients first): it must still run and answer a while after the burst.
	running := true
	for end := time.Now().Add(peerForgeWatch); running && time.Now().Before(end) && ctx.Err() == nil; {
		sleepCtx(ctx, 200*time.Millisecond)
		running = r.c.Running(target)
	}
	if _, err := r.c.Status(ctx, target); err != nil && ctx.Err() == nil {
		running = false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	at := time.Duration(r.hist.now())
	if !running {
		r.peerForgeFindings = append(r.peerForgeFindings, fmt.Sprintf("%s stopped or stopped answering after forged peer messages at %v", r.c.Nodes[target].Name, at))
	}
	if werr != nil {
		r.peerForgeFindings = append(r.peerForgeFindings, fmt.Sprintf("no leader within %v of forged peer messages to %s at %v: %v", peerForgeBound, r.c.Nodes[target].Name, at, werr))
	}
}

// forgedBurst is 1–4 forged messages: own is the node's term, commit its commit index, self its id,
// leader the leader's.
func forgedBurst(rng *rand.Rand, own, commit, self, leader uint64) []*raftpb.Message {
	terms := []uint64{1<<62 - 1, 1 << 62, 1<<63 - 1, 1 << 63, math.MaxUint64, own + 1<<33}
	var voters []uint64 // a configuration naming the node and the leader: what raft checks first
	voters = append(voters, min(self, leader), max(self, leader))
	msgs := make([]*raftpb.Message, 1+rng.IntN(4))
	for i := range msgs {
		switch rng.IntN(4) {
		case 0, 1:
			msgs[i] = &raftpb.Message{Type: raftpb.MsgHeartbeat.Enum(), Term: new(terms[rng.IntN(len(terms))]), Commit: new(uint64(0))}
		case 2:
			msgs[i] = &raftpb.Message{Type: raftpb.MsgHeartbeat.Enum(), Term: new(own), Commit: new(commit + 1<<30)}
		default:
			at := commit + 1000
			data := []byte("not a snapshot")
			if rng.IntN(2) == 0 {
				data = nil
			}
			msgs[i] = &raftpb.Message{Type: raftpb.MsgSnap.Enum(), Term: new(own), Snapshot: &raftpb.Snapshot{
				Data: data, Metadata: &raftpb.SnapshotMetadata{Index: &at, Term: new(own), ConfState: &raftpb.ConfState{Voters: voters}},
			}}
		}
	}
	return msgs
}

// forgePeerLink writes msgs from from to to on a raft link of its own (server/transport/wire.go): the
// hello, one batch frame, the bye; it returns the node's refusal, if it sent one.
func forgePeerLink(addr string, cluster, from, to uint64, msgs []*raftpb.Message) error {
	const hello = "leased-raft/1\n"
	b := &wirepb.RaftBatch{ClusterId: cluster, From: from, To: to}
	for _, m := range msgs {
		m.From, m.To = &from, &to
		raw, err := proto.Marshal(m)
		if err != nil {
			return err
		}
		b.Messages = append(b.Messages, raw)
	}
	raw, err := proto.Marshal(b)
	if err != nil {
		return err
	}
	frame := func(kind byte, payload []byte) []byte {
		return append(binary.BigEndian.AppendUint32(nil, uint32(1+len(payload))), append([]byte{kind}, payload...)...)
	}
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	out := append(append([]byte(hello), frame(1, raw)...), frame(2, nil)...)
	if _, err := c.Write(out); err != nil {
		return err
	}
	answer := make([]byte, 256)
	n, _ := c.Read(answer) // the hello back, or a refusal
	if n < len(hello) || string(answer[:len(hello)]) != hello {
		return fmt.Errorf("no hello back from %s: %q", addr, answer[:n])
	}
	return nil
}
