package raftnode

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"go.etcd.io/raft/v3"

	"github.com/leased/leased/api/leasepb"
)

// Leader loss by crash: a leader whose process dies closes its connections, and each follower's inbound
// raft stream from it breaks at once (transport.Config.OnStreamLost). Without a hint the followers wait
// out the election timeout; with PreVote and CheckQuorum they would also refuse each other's pre-votes
// for that long, having heard from the leader recently. So a follower whose stream from its leader broke
// forgets that leader (raft's ForgetLeader: it grants pre-votes at once) and, in its turn, campaigns.
// The campaign is a pre-vote: it takes no term and disturbs nothing unless a majority also lost the
// leader — the other followers saw the same broken stream and forgot it too. A live leader whose stream
// merely reset is heard again at its next heartbeat, and its followers take it back. Raft's safety does
// not depend on when elections happen; this only makes a crashed leader's successor come sooner (a
// frozen or partitioned leader breaks no stream and is found by the election timeout, as before).

// LeaderLoss acts on the transport's hints that a peer's stream broke.
type LeaderLoss struct {
	cfg  LeaderLossConfig
	lost chan uint64 // the hint pending for Run, at most one
}

// LeaderLossConfig is what LeaderLoss needs of the node.
type LeaderLossConfig struct {
	Self     uint64
	Election time.Duration // the election timeout
	Raft     LeaderLossRaft
	// Leader is the leader raft knows (0: none), and IsLeader whether this node leads.
	Leader   func() uint64
	IsLeader func() bool
	// Forgot hears each time this follower forgets its leader on a hint (a metric).
	Forgot func()
	Log    *slog.Logger
}

// LeaderLossRaft is the part of raft LeaderLoss uses; its calls may come from any goroutine.
type LeaderLossRaft interface {
	ForgetLeader(ctx context.Context) error
	Campaign(ctx context.Context) error
	Status() raft.Status
}

// NewLeaderLoss returns a LeaderLoss that acts once Run runs.
func NewLeaderLoss(cfg LeaderLossConfig) *LeaderLoss {
	return &LeaderLoss{cfg: cfg, lost: make(chan uint64, 1)}
}

// StreamLost is the transport's hint (OnStreamLost); it runs on a transport goroutine, so it only
// hands the peer to Run, dropping the hint if one is already pending.
func (l *LeaderLoss) StreamLost(peer uint64) {
	select {
	case l.lost <- peer:
	default:
	}
}

// Run acts on the hints until ctx ends. Each hint that names the leader starts its own
// turn and replaces the turn a previous one was waiting for: a leader elected after one crash may crash in
// turn before that wait is over, and its successor should not wait behind it.
func (l *LeaderLoss) Run(ctx context.Context) {
	turn := time.NewTimer(0)
	defer turn.Stop()
	<-turn.C
	var lost uint64 // the leader whose loss the pending turn is for; 0: none pending
	for {
		select {
		case <-ctx.Done():
			return
		case peer := <-l.lost:
			if wait, ok := l.leaderStreamLost(ctx, peer); ok {
				turn.Reset(wait)
				lost = peer
			}
		case <-turn.C:
			l.campaignInTurn(ctx, lost)
			lost = 0
		}
	}
}

// leaderStreamLost forgets the leader if peer is this follower's leader, and returns how long to wait for
// this follower's turn to campaign (ok false: it does not campaign). Followers that lost the leader at
// the same moment would campaign at the same moment and split the vote (each votes for itself), so they
// take turns: the voters other than the lost leader, in id order, campaign one campaignStagger apart after
// a campaignSettle, each only if no leader is known by its turn (campaignInTurn).
func (l *LeaderLoss) leaderStreamLost(ctx context.Context, peer uint64) (wait time.Duration, ok bool) {
	if peer != l.cfg.Leader() || l.cfg.IsLeader() {
		return 0, false
	}
	l.cfg.Log.Info("the leader's raft stream broke: forgetting it", "leader", leasepb.FormatID(peer))
	l.cfg.Forgot()
	if err := l.cfg.Raft.ForgetLeader(ctx); err != nil {
		return 0, false // stopping
	}
	rank, voter := campaignRank(l.cfg.Raft.Status().Config.Voters.IDs(), l.cfg.Self, peer)
	if !voter {
		return 0, false
	}
	return l.campaignSettle() + time.Duration(rank)*l.campaignStagger(), true
}

// campaignInTurn campaigns, once this follower's turn came after it lost leader lost, unless another
// leader is known by now.
func (l *LeaderLoss) campaignInTurn(ctx context.Context, lost uint64) {
	if lead := l.cfg.Leader(); lead != raft.None && lead != lost {
		return // a new leader was elected
	}
	l.cfg.Log.Info("campaigning after the leader's stream broke")
	_ = l.cfg.Raft.Campaign(ctx)
}

// campaignSettle is how long even the first follower in turn waits before it campaigns: the other
// followers see the same stream break, but a few milliseconds apart, and one that has not yet forgotten
// the leader refuses the pre-vote (it heard from a leader within the election timeout). Campaigning at
// once lost that race so often that the median failover was the second turn's, a stagger later (0.25 s
// with the defaults, 5 leader kills in `bench --rows=failover`).
func (l *LeaderLoss) campaignSettle() time.Duration { return l.cfg.Election / 20 }

// campaignStagger is the time between two followers' turns: enough for one pre-vote, vote and the new
// leader's first heartbeat, well under the election timeout.
func (l *LeaderLoss) campaignStagger() time.Duration { return l.cfg.Election / 5 }

// campaignRank is self's place among the voters other than lost, in id order; voter is false if self
// is not a voter (a learner does not campaign).
func campaignRank(voters map[uint64]struct{}, self, lost uint64) (rank int, voter bool) {
	ids := make([]uint64, 0, len(voters))
	for id := range voters {
		if id != lost {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	rank = slices.Index(ids, self)
	return rank, rank >= 0
}
