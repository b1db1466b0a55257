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

// autoPromote runs on every node and acts while it leads: every raft tick it samples each learner's
// progress, and it promotes one that has been caught up and active for promoteAfter. It returns when stop
// closes.
//
// It samples every tick, not every election timeout, because raft clears a follower's RecentActive at each
// of the leader's quorum checks (one per election timeout) and sets it again only when the next answer
// arrives, a heartbeat later. Sampled once per election timeout, the ticker and the quorum check keep the
// same phase, so an idle learner could be seen inactive at every sample for as long as the phase held
// (51 s in one soak). Sampled every tick, a live learner is seen active in most samples of every election
// timeout.
func (n *node) autoPromote(stop <-chan struct{}) {
	ctx, cancel := stopContext(stop)
	defer cancel()
	tick := time.NewTicker(n.cfg.TickInterval)
	defer tick.Stop()
	learners := learnerTracker{activeWithin: n.cfg.ElectionTimeout(), promoteAfter: n.cfg.promoteAfter()}
	waiting := learnerWatch{} // learner -> since when it has been a learner under this leader
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		if !n.isLeader() {
			learners.reset()
			clear(waiting)
			continue
		}
		st, now := n.raft.Status(), time.Now()
		waiting.report(n, st, now)
		if id, ok := learners.observe(n.id, st, now); ok {
			if err := n.promoteMember(ctx, id); err != nil {
				n.log.Info("automatic promotion did not happen", "member", leasepb.FormatID(id), "err", err)
			} else {
				n.log.Info("promoted a caught-up learner", "member", leasepb.FormatID(id))
			}
			learners.forget(id)
		}
	}
}

// learnerTracker decides, from a series of samples of raft's progress, which learner is ready for
// promotion: one whose log has stayed within promoteLag of the leader's and which has answered the leader
// within activeWithin, continuously for promoteAfter.
type learnerTracker struct {
	activeWithin, promoteAfter time.Duration
	learners                   map[uint64]*learnerState
}

// learnerState is what the tracker remembers of one learner.
type learnerState struct {
	heard time.Time // the last sample in which raft had heard from it since its last quorum check
	ready time.Time // since when it has been caught up and active; zero if it is not
}

func (t *learnerTracker) reset() { clear(t.learners) }

func (t *learnerTracker) forget(id uint64) { delete(t.learners, id) }

// observe takes one sample of the leader's (self's) raft status and returns a learner ready for promotion.
func (t *learnerTracker) observe(self uint64, st raft.Status, now time.Time) (uint64, bool) {
	if t.learners == nil {
		t.learners = map[uint64]*learnerState{}
	}
	for id := range t.learners {
		if pr, ok := st.Progress[id]; !ok || !pr.IsLearner {
			delete(t.learners, id)
		}
	}
	last := st.Progress[self].Match
	for id, pr := range st.Progress {
		if !pr.IsLearner {
			continue
		}
		ls := t.learners[id]
		if ls == nil {
			ls = &learnerState{}
			t.learners[id] = ls
		}
		if pr.RecentActive {
			ls.heard = now
		}
		active := !ls.heard.IsZero() && now.Sub(ls.heard) <= t.activeWithin
		if !caughtUp(pr.Match, last) || !active {
			ls.ready = time.Time{}
			continue
		}
		if ls.ready.IsZero() {
			ls.ready = now
			continue
		}
		if now.Sub(ls.ready) >= t.promoteAfter {
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
