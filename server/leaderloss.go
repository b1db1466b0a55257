package server

import (
	"context"
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

// streamLost is the transport's hint (OnStreamLost); it runs on a transport goroutine, so it only
// hands the peer to leaderLossLoop, dropping the hint if one is already pending.
func (n *node) streamLost(peer uint64) {
	select {
	case n.lostStreams <- peer:
	default:
	}
}

// leaderLossLoop acts on the hints until stop closes.
func (n *node) leaderLossLoop(stop <-chan struct{}) {
	ctx, cancel := stopContext(stop)
	defer cancel()
	for {
		select {
		case <-stop:
			return
		case peer := <-n.lostStreams:
			n.leaderStreamLost(ctx, peer)
		}
	}
}

// leaderStreamLost forgets the leader and campaigns if peer is this follower's leader. Followers that
// lost it at the same moment would campaign at the same moment and split the vote (each votes for
// itself), so they take turns: the voters other than the lost leader, in id order, campaign one
// campaignStagger apart after a campaignSettle, each only if no leader is known by its turn.
func (n *node) leaderStreamLost(ctx context.Context, peer uint64) {
	if peer != n.leader.Load() || n.isLeader() {
		return
	}
	n.log.Info("the leader's raft stream broke: forgetting it", "leader", leasepb.FormatID(peer))
	n.metrics.leaderStreamLost.Inc()
	if err := n.raft.ForgetLeader(ctx); err != nil {
		return // stopping
	}
	rank, voter := campaignRank(n.raft.Status().Config.Voters.IDs(), n.id, peer)
	if !voter {
		return
	}
	t := time.NewTimer(n.campaignSettle() + time.Duration(rank)*n.campaignStagger())
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-t.C:
	}
	if lead := n.leader.Load(); lead != raft.None && lead != peer {
		return // a new leader was elected
	}
	n.log.Info("campaigning after the leader's stream broke", "turn", rank)
	_ = n.raft.Campaign(ctx)
}

// campaignSettle is how long even the first follower in turn waits before it campaigns: the other
// followers see the same stream break, but a few milliseconds apart, and one that has not yet forgotten
// the leader refuses the pre-vote (it heard from a leader within the election timeout). Campaigning at
// once lost that race so often that the median failover was the second turn's, a stagger later (0.25 s
// with the defaults, 5 leader kills in `bench --rows=failover`).
func (n *node) campaignSettle() time.Duration { return n.cfg.ElectionTimeout() / 20 }

// campaignStagger is the time between two followers' turns: enough for one pre-vote, vote and the new
// leader's first heartbeat, well under the election timeout.
func (n *node) campaignStagger() time.Duration { return n.cfg.ElectionTimeout() / 5 }

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
