package server

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/fsm"
)

// recordingRaft is a raftControl that only records what is proposed to it.
type recordingRaft struct {
	raftControl
	proposed []*wirepb.Command
}

func (r *recordingRaft) propose(_ context.Context, p proposal) error {
	cmd := &wirepb.Command{}
	if err := proto.Unmarshal(p.data, cmd); err != nil {
		return err
	}
	r.proposed = append(r.proposed, cmd)
	return nil
}

// TestLessorCommandFromEarlierTermIsNotProposed: a command the lessor decided while leading in one term,
// still queued when the node lost leadership and won it back in a later term, never reaches the log
// (between the two terms another leader may have renewed the leases it names); one decided in the
// current term does.
func TestLessorCommandFromEarlierTermIsNotProposed(t *testing.T) {
	cfg := TestConfig()
	clock := NewManualClock()
	out := make(chan lessorCmd, 16)
	rr := &recordingRaft{}
	n := &node{cfg: cfg, log: slog.New(slog.DiscardHandler), clock: clock, raft: rr, lessor: newLessor(cfg, out)}
	sm, index := fsm.New(), uint64(0)
	grant := func(resource string) {
		index++
		res, err := sm.Apply(index, acquireCmd(resource, time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n.lessor.applied(clock.Now(), res)
	}
	lead := func(term uint64) {
		n.term.Store(term)
		n.role.Store(int32(raft.StateLeader))
		n.lessor.promote(clock.Now(), term)
	}
	lead(2)
	grant("old")
	clock.Advance(2 * time.Second)
	n.lessor.tick(clock.Now()) // decides Expire(old) in term 2; the proposer has not taken it yet

	n.role.Store(int32(raft.StateFollower)) // another leader in term 3
	n.term.Store(3)
	n.lessor.demote()
	lead(4)
	grant("new")
	clock.Advance(2 * time.Second)
	n.lessor.tick(clock.Now()) // decides Expire(new) in term 4 (old is queued again too)

	for len(out) > 0 {
		n.proposeAsync(<-out)
	}
	var got [][]string
	for _, cmd := range rr.proposed {
		var expired []string
		for _, ref := range cmd.GetExpire().GetLeases() {
			expired = append(expired, ref.GetResource())
		}
		got = append(got, expired)
	}
	// Term 4's expiry names both leases (old was still live when this node took over again).
	if len(got) != 1 || len(got[0]) != 2 {
		t.Fatalf("proposed expiries %v; want only the one decided in term 4, [new old] in some order", got)
	}
}
