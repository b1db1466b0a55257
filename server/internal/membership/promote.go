package membership

import (
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/tracker"
)

// learnerTracker decides, from a series of samples of raft's progress, which learner is ready for
// promotion: one whose log has stayed within promoteLag of the leader's and which has answered the leader
// within activeWithin, continuously for promoteAfter.
//
// It also notices a learner that stays unpromoted much longer than catching up takes, and hands its
// progress as the leader sees it to slow (if set) every slowLearner, so an operator (or a soak's
// artifacts) can tell a learner that is behind from one whose answers do not reach the leader.
type learnerTracker struct {
	activeWithin, promoteAfter time.Duration
	slow                       func(id uint64, pr tracker.Progress, leaderLast uint64, unpromotedFor time.Duration)
	learners                   map[uint64]*learnerState
}

// learnerState is what the tracker remembers of one learner.
type learnerState struct {
	heard time.Time // the last sample in which raft had heard from it since its last quorum check
	ready time.Time // since when it has been caught up and active; zero if it is not
	// first is when this leader first saw it as a learner; logged when it last reported it slow.
	first, logged time.Time
}

// slowLearner is how long a learner may stay one before its progress is reported.
const slowLearner = 10 * time.Second

func (t *learnerTracker) reset() { clear(t.learners) }

// restart makes a learner earn its promotion again (after a promotion that did not happen).
func (t *learnerTracker) restart(id uint64) {
	if ls := t.learners[id]; ls != nil {
		ls.ready = time.Time{}
	}
}

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
			ls = &learnerState{first: now, logged: now}
			t.learners[id] = ls
		}
		if t.slow != nil && now.Sub(ls.logged) >= slowLearner {
			t.slow(id, pr, last, now.Sub(ls.first))
			ls.logged = now // again in slowLearner
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
