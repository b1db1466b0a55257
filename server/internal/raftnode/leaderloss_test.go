package raftnode

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/quorum"
)

func TestCampaignRank(t *testing.T) {
	voters := map[uint64]struct{}{30: {}, 10: {}, 20: {}, 40: {}}
	for _, c := range []struct {
		self, lost uint64
		rank       int
		voter      bool
	}{
		{10, 40, 0, true}, {20, 40, 1, true}, {30, 40, 2, true}, // the lost leader takes no turn
		{20, 10, 0, true}, {40, 10, 2, true},
		{50, 10, -1, false}, // a learner
	} {
		rank, voter := campaignRank(voters, c.self, c.lost)
		if rank != c.rank || voter != c.voter {
			t.Errorf("campaignRank(self %d, lost %d) = %d, %v; want %d, %v", c.self, c.lost, rank, voter, c.rank, c.voter)
		}
	}
}

// campaignRecorder is a LeaderLossRaft that records when Campaign is called.
type campaignRecorder struct {
	voters quorum.MajorityConfig

	mu        sync.Mutex
	campaigns []time.Time
}

func (r *campaignRecorder) ForgetLeader(context.Context) error { return nil }

func (r *campaignRecorder) Status() raft.Status {
	var st raft.Status
	st.Config.Voters[0] = r.voters
	return st
}

func (r *campaignRecorder) Campaign(context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.campaigns = append(r.campaigns, time.Now())
	return nil
}

func (r *campaignRecorder) calls() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Time(nil), r.campaigns...)
}

// TestALaterLeaderLossReplacesTheTurnAwaited: node 3 of {1, 2, 3} loses leader 1 and waits for its turn
// (second, after node 2); node 2 is elected and crashes too, 10 ms later. Node 3's turn for losing 2 starts
// then, in its own right: it campaigns one turn after that second hint, not after the first turn's wait
// ran out (the hints used to be handled one at a time), and never for the first loss, whose leader was
// already replaced.
func TestALaterLeaderLossReplacesTheTurnAwaited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &campaignRecorder{voters: quorum.MajorityConfig{1: {}, 2: {}, 3: {}}}
		var leader atomic.Uint64
		n := NewLeaderLoss(LeaderLossConfig{Self: 3, Election: 100 * time.Millisecond, Raft: rec, // TestConfig's
			Leader: leader.Load, IsLeader: func() bool { return false }, Forgot: func() {}, Log: slog.New(slog.DiscardHandler)})
		ctx, stop := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			n.Run(ctx)
		}()
		defer func() {
			stop()
			<-done
		}()
		wait := n.campaignSettle() + n.campaignStagger() // node 3's turn: the second
		start := time.Now()
		leader.Store(1)
		n.StreamLost(1)
		time.Sleep(10 * time.Millisecond) // virtual: node 2 is elected, then crashes
		leader.Store(2)
		n.StreamLost(2)
		time.Sleep(2 * wait)
		got := rec.calls()
		if len(got) != 1 {
			t.Fatalf("campaigned %d times, want once (for the loss of 2)", len(got))
		}
		if at, want := got[0].Sub(start), 10*time.Millisecond+wait; at != want {
			t.Fatalf("campaigned %v after the first hint, want %v: one turn after the second hint", at, want)
		}
	})
}
