package fsm

import (
	"fmt"

	"github.com/leased/leased/api/wirepb"
)

// Stale attempts. The SDK numbers the attempts of one acquire intent (one request id) 1, 2, 3... An
// attempt can reach the leader long after the client gave up on it (a stalled link delivers its bytes
// at heal, and gRPC's relative grpc-timeout gives it a fresh deadline there), when a later attempt was
// already answered. Applying it then would make the intent take effect after its definite answer: a
// caller told "held" would get the lease afterwards, and nobody would renew it. So the state machine
// remembers, per dedup key, the highest attempt it answered with a refusal and whether a grant made
// under the key has ended, and refuses a stale attempt with Superseded, changing nothing:
//
//   - an attempt numbered at or below the highest refused one (a later attempt was answered first);
//   - any numbered attempt after the key's grant ended (released or expired): the intent is finished.
//
// A live grant under the key is answered as before (replayed, or RequestReused), whatever the attempt:
// that is the intent's answer. A numbered attempt above the highest refused one proceeds normally. An
// entry without an attempt number (from a client that does not number its attempts) is neither checked
// nor remembered as refused: each is decided on its own, as such a client expects.
//
// A blocking acquire's proposals (wait set) are retried by the server while it waits: their Held and
// lock-delay refusals are not answers to the client, so they are not remembered.
//
// The memory is bounded: the last MaxRememberedRequests keys first remembered, evicted oldest first in
// apply order (a key updated later keeps its place), so every node forgets the same keys at the same
// index. It is part of the snapshot.

// MaxRememberedRequests is how many acquire intents (dedup keys) the state machine remembers as refused
// or ended. A stale attempt of an intent forgotten since is decided as it would have been without
// attempt numbers. With the maximal names (request id 64 bytes, identity 256) the memory is about
// 8 MiB; with typical ones about 3 MiB.
const MaxRememberedRequests = 16384

// answered is what is remembered of one intent.
type answered struct {
	// attempt is the highest attempt answered with a refusal (0: none).
	attempt uint32
	// ended: a grant made under the key was released or expired.
	ended bool
}

// answeredLog is the bounded memory: byKey and the keys in the order they were first remembered.
type answeredLog struct {
	byKey map[requestKey]*answered
	order []requestKey // order[head:] are the remembered keys, oldest first
	head  int
}

func newAnsweredLog() answeredLog {
	return answeredLog{byKey: make(map[requestKey]*answered)}
}

// entry returns the key's record, creating it (and evicting the oldest beyond the bound) if needed.
func (a *answeredLog) entry(k requestKey) *answered {
	if r, ok := a.byKey[k]; ok {
		return r
	}
	if len(a.byKey) >= MaxRememberedRequests {
		a.evictOldest()
	}
	r := &answered{}
	a.byKey[k] = r
	a.order = append(a.order, k)
	return r
}

func (a *answeredLog) evictOldest() {
	delete(a.byKey, a.order[a.head])
	a.order[a.head] = requestKey{}
	a.head++
	if a.head >= MaxRememberedRequests/2 { // reuse the slice's front half
		a.order = append(a.order[:0], a.order[a.head:]...)
		a.head = 0
	}
}

func (a *answeredLog) len() int { return len(a.byKey) }

// ascend calls fn for every remembered key, oldest first.
func (a *answeredLog) ascend(fn func(requestKey, answered)) {
	for _, k := range a.order[a.head:] {
		fn(k, *a.byKey[k])
	}
}

// acquireAttempt is acquire with the stale-attempt check before it and the refusal remembered after.
func (f *FSM) acquireAttempt(index uint64, c *wirepb.AcquireCmd) Result {
	if res, stale := f.staleAttempt(c); stale {
		return res
	}
	res := f.acquire(index, c)
	f.rememberRefusal(c, res)
	return res
}

// staleAttempt answers a numbered attempt that a later attempt's refusal, or the end of the intent's
// grant, superseded.
func (f *FSM) staleAttempt(c *wirepb.AcquireCmd) (Result, bool) {
	if c.GetAttempt() == 0 || c.GetRequestId() == "" {
		return Result{}, false
	}
	k := keyOfCmd(c)
	if _, live := f.byRequest.get(k); live {
		return Result{}, false // the live grant answers it (sameRequest)
	}
	r, ok := f.answered.byKey[k]
	switch {
	case !ok:
		return Result{}, false
	case r.ended:
		return Result{Code: Superseded, Stale: StaleAttempt{RequestID: c.GetRequestId(), Attempt: c.GetAttempt(), Answered: r.attempt, GrantEnded: true}}, true
	case c.GetAttempt() <= r.attempt:
		return Result{Code: Superseded, Stale: StaleAttempt{RequestID: c.GetRequestId(), Attempt: c.GetAttempt(), Answered: r.attempt}}, true
	}
	return Result{}, false
}

// rememberRefusal records a numbered attempt's refusal as its intent's answer. Only the refusals that
// depend on the state are remembered (an Invalid command is refused whatever the state, and
// RequestReused names a live grant, which answers every attempt anyway).
func (f *FSM) rememberRefusal(c *wirepb.AcquireCmd, res Result) {
	if c.GetAttempt() == 0 || c.GetRequestId() == "" {
		return
	}
	switch res.Code {
	case Held, LockDelayed:
		if c.GetWait() {
			return // the blocking acquire keeps waiting: not an answer
		}
	case HolderLimit, IdentityLimit, LimitMismatch, Denied:
	default:
		return
	}
	if r := f.answered.entry(keyOfCmd(c)); c.GetAttempt() > r.attempt {
		r.attempt = c.GetAttempt()
	}
}

// rememberEnd records that the grant l, made under a request id, ended (released or expired).
func (f *FSM) rememberEnd(l *lease) {
	if l.requestID == "" {
		return
	}
	f.answered.entry(keyOf(l)).ended = true
}

// answeredRecords is the memory in snapshot form, oldest first.
func (f *FSM) answeredRecords() []*wirepb.AnsweredRequestRecord {
	out := make([]*wirepb.AnsweredRequestRecord, 0, f.answered.len())
	f.answered.ascend(func(k requestKey, r answered) {
		out = append(out, &wirepb.AnsweredRequestRecord{
			Identity: k.identity, Holder: k.holder, RequestId: k.id, AnsweredAttempt: r.attempt, GrantEnded: r.ended,
		})
	})
	return out
}

// restoreAnswered rebuilds the memory from a snapshot's records (oldest first). A snapshot with more
// records than this binary keeps keeps its newest ones, as applying would have.
func (f *FSM) restoreAnswered(records []*wirepb.AnsweredRequestRecord) error {
	for i, r := range records {
		k := requestKey{identity: r.GetIdentity(), holder: r.GetHolder(), id: r.GetRequestId()}
		switch {
		case k.id == "" || (k.identity == "") == (k.holder == ""):
			return errBadAnswered(i, "names no dedup key (a request id and exactly one of identity, holder)")
		case r.GetAnsweredAttempt() == 0 && !r.GetGrantEnded():
			return errBadAnswered(i, "remembers nothing")
		}
		if _, dup := f.answered.byKey[k]; dup {
			return errBadAnswered(i, "repeats a key")
		}
		*f.answered.entry(k) = answered{attempt: r.GetAnsweredAttempt(), ended: r.GetGrantEnded()}
	}
	return nil
}

func errBadAnswered(i int, why string) error {
	return fmt.Errorf("%w: answered request %d %s", ErrBadSnapshot, i, why)
}
