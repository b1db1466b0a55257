package server

import (
	"context"
	"time"

	"go.etcd.io/raft/v3"

	"github.com/leased/leased/api/leasepb"
)

// promoteAfter is how long a learner must stay caught up (within promoteLag of the leader's last index)
// before the leader promotes it: long enough that a learner that only touched the leader's index once,
// mid-snapshot or mid-burst, is not made a voter that would then slow every commit.
func (c Config) promoteAfter() time.Duration { return 5 * c.ElectionTimeout() }

// autoPromote runs on every node and acts while it leads: once per election timeout it looks at each
// learner's progress, and promotes one that has been caught up and active for promoteAfter. It returns
// when stop closes.
func (n *node) autoPromote(stop <-chan struct{}) {
	ctx, cancel := stopContext(stop)
	defer cancel()
	tick := time.NewTicker(n.cfg.ElectionTimeout())
	defer tick.Stop()
	since := map[uint64]time.Time{} // learner -> since when it has been caught up
	waiting := learnerWatch{}       // learner -> since when it has been a learner under this leader
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		if !n.isLeader() {
			clear(since)
			clear(waiting)
			continue
		}
		st, now := n.raft.Status(), time.Now()
		waiting.report(n, st, now)
		if id, ok := n.learnerToPromote(st, since, now); ok {
			if err := n.promoteMember(ctx, id); err != nil {
				n.log.Info("automatic promotion did not happen", "member", leasepb.FormatID(id), "err", err)
			} else {
				n.log.Info("promoted a caught-up learner", "member", leasepb.FormatID(id))
			}
			delete(since, id)
		}
	}
}

// learnerToPromote updates since (learner -> since when it has been caught up) from raft's progress and
// returns a learner caught up for long enough.
func (n *node) learnerToPromote(st raft.Status, since map[uint64]time.Time, now time.Time) (uint64, bool) {
	last := st.Progress[n.id].Match
	for id := range since {
		if pr, ok := st.Progress[id]; !ok || !pr.IsLearner {
			delete(since, id)
		}
	}
	for id, pr := range st.Progress {
		if !pr.IsLearner {
			continue
		}
		if !caughtUp(pr.Match, last) || !pr.RecentActive {
			delete(since, id)
			continue
		}
		t, ok := since[id]
		if !ok {
			since[id] = now
			continue
		}
		if now.Sub(t) >= n.cfg.promoteAfter() {
			return id, true
		}
	}
	return 0, false
}

// stopContext is a context cancelled when stop closes (or cancel is called).
func stopContext(stop <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// learnerWatch notices a learner that stays unpromoted much longer than catching up takes, and logs its
// progress as the leader sees it, every slowLearner, so an operator (or a soak's artifacts) can tell a
// learner that is behind from one whose answers do not reach the leader.
type learnerWatch map[uint64]*learnerSeen

// learnerSeen is when the leader first saw a learner, and when it last logged it.
type learnerSeen struct{ first, logged time.Time }

// slowLearner is how long a learner may stay one before its progress is logged.
const slowLearner = 10 * time.Second

func (w learnerWatch) report(n *node, st raft.Status, now time.Time) {
	last := st.Progress[n.id].Match
	for id := range w {
		if pr, ok := st.Progress[id]; !ok || !pr.IsLearner {
			delete(w, id)
		}
	}
	for id, pr := range st.Progress {
		if !pr.IsLearner {
			continue
		}
		seen, ok := w[id]
		if !ok {
			w[id] = &learnerSeen{first: now, logged: now}
			continue
		}
		if now.Sub(seen.logged) >= slowLearner {
			n.log.Warn("learner not promoted yet", "member", leasepb.FormatID(id), "for", now.Sub(seen.first).Round(time.Second),
				"match", pr.Match, "leader_last", last, "recent_active", pr.RecentActive, "state", pr.State.String(),
				"caught_up", caughtUp(pr.Match, last))
			seen.logged = now // again in slowLearner
		}
	}
}
