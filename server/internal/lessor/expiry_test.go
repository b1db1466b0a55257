package lessor

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server/internal/errs"
)

// TestRenewedLeasesExpireAtTheirLastDeadline: the deadline heap is updated lazily (a renewal leaves it
// alone, expireDue requeues), so a lease renewed many times must still expire at its last renewal plus
// its TTL — never at a deadline it was queued at earlier, and not much later — including across a stall
// that shifts every deadline.
func TestRenewedLeasesExpireAtTheirLastDeadline(t *testing.T) {
	const n, tick = 60, 10 * time.Millisecond
	cfg := testConfig()
	cfg.CheckpointInterval = time.Hour // no lease goes idle: renewals stay in memory
	s := newLessorSim(t, 1, cfg)
	s.elect(0)
	type lease struct {
		name     string
		token    uint64
		ttl      time.Duration
		stop     time.Time // renewed until then
		deadline time.Time // the last renewal plus its TTL, shifted by the stall if after it
	}
	start := s.clock.Now()
	leases := make([]*lease, n)
	for i := range leases {
		l := &lease{name: fmt.Sprintf("r%02d", i), ttl: time.Duration(1000+50*i) * time.Millisecond}
		l.stop = start.Add(time.Duration(i*150) * time.Millisecond)
		l.token = s.apply(acquireCmd(l.name, l.ttl)).Lease.Token
		l.deadline = s.clock.Now().Add(l.ttl)
		leases[i] = l
	}
	const gap = 700 * time.Millisecond
	stalled := false
	for end := start.Add(15 * time.Second); s.clock.Now().Before(end); {
		now := s.clock.Now()
		if !stalled && now.Sub(start) >= 4*time.Second {
			stalled = true
			s.clock.Advance(gap)
			s.lessors[0].Extend(gap)
			for _, l := range leases {
				if _, gone := s.expired[l.name]; !gone {
					l.deadline = l.deadline.Add(gap)
				}
			}
			continue
		}
		for _, l := range leases {
			// Renew every TTL/3 until the lease's stop time, as a holder's SDK does.
			if _, gone := s.expired[l.name]; !gone && now.Before(l.stop) && l.deadline.Sub(now) <= l.ttl*2/3 {
				if !s.renew(l.name, l.token) {
					t.Fatalf("%s: renewal refused %v before its deadline", l.name, l.deadline.Sub(now))
				}
				l.deadline = now.Add(l.ttl)
			}
		}
		s.step(tick, tick)
	}
	for _, l := range leases {
		at, gone := s.expired[l.name]
		switch {
		case !gone:
			t.Errorf("%s never expired (deadline %v after start)", l.name, l.deadline.Sub(start))
		case at.Before(l.deadline):
			t.Errorf("%s expired %v before its last deadline", l.name, l.deadline.Sub(at))
		case at.Sub(l.deadline) > 2*tick:
			t.Errorf("%s expired %v after its last deadline", l.name, at.Sub(l.deadline))
		}
	}
}

// TestTokenOfAnotherResourceIsNotCurrent: the lessor finds leases by token alone, so every lookup must
// also match the resource — a renewal, checkpoint or release naming a live token with another resource
// touches nothing.
func TestTokenOfAnotherResourceIsNotCurrent(t *testing.T) {
	s := newLessorSim(t, 1, testConfig())
	s.elect(0)
	tok := s.apply(acquireCmd("a", 2*time.Second)).Lease.Token
	l := s.lessors[0]
	if _, err := l.checkRenew("b", tok); err != errs.ErrNotCurrent {
		t.Fatalf("checkRenew of another resource's token: %v, want ErrNotCurrent", err)
	}
	if _, err := l.renew("b", tok, s.clock.Now()); err != errs.ErrNotCurrent {
		t.Fatalf("renew of another resource's token: %v, want ErrNotCurrent", err)
	}
	l.mu.Lock()
	l.remove("b", tok)
	l.mu.Unlock()
	if l.current("a", tok) == nil {
		t.Fatal("removing (b, token) removed (a, token)")
	}
	if _, err := l.renew("a", tok, s.clock.Now()); err != nil {
		t.Fatalf("renew of the lease itself: %v", err)
	}
}

// TestBatchedRenewalsUseTheTimersTheCheckFound: a batch is checked, then (after the leadership
// confirmation) renewed through the timers the check found. A lease released in between is gone (even
// though its timer's slot now holds another lease); one
// granted in between (not current when checked) is looked up again and renewed; after a leader change in
// between every lease is looked up again.
func TestBatchedRenewalsUseTheTimersTheCheckFound(t *testing.T) {
	s := newLessorSim(t, 1, testConfig())
	s.elect(0)
	l := s.lessors[0]
	a := s.apply(acquireCmd("a", 2*time.Second)).Lease.Token
	kept := s.apply(acquireCmd("kept", 2*time.Second)).Lease.Token
	batch := []Renewal{{Resource: "a", Token: a}, {Resource: "kept", Token: kept}, {Resource: "b", Token: kept + 2}}
	gen, err := l.CheckRenewals(batch)
	if err != nil {
		t.Fatal(err)
	}
	if batch[0].t == nil || batch[1].t == nil || batch[2].t != nil {
		t.Fatalf("checked: a %v, kept %v, b %v; want a and kept found, b not yet", batch[0].t, batch[1].t, batch[2].t)
	}
	s.apply(&wirepb.Command{Op: &wirepb.Command_Release{Release: &wirepb.ReleaseCmd{Resource: "a", Token: a}}})
	if tok := s.apply(acquireCmd("b", 2*time.Second)).Lease.Token; tok != kept+2 {
		t.Fatalf("b granted token %d, the test expects %d", tok, kept+2)
	}
	l.mu.Lock()
	reused := l.current("b", kept+2) == batch[0].t
	l.mu.Unlock()
	if !reused { // so a's renewal below holds a timer that is now b's
		t.Fatal("b's timer is not the slot a's release freed; the test expects the slab to reuse it")
	}
	if err := l.RenewChecked(gen, batch, s.clock.Now()); err != nil {
		t.Fatal(err)
	}
	if batch[0].Err != errs.ErrNotCurrent {
		t.Errorf("a, released after the check: %v, want ErrNotCurrent", batch[0].Err)
	}
	if batch[1].Err != nil || batch[2].Err != nil || batch[1].TTL != 2*time.Second || batch[2].TTL != 2*time.Second {
		t.Errorf("kept: %v %v, b (granted after the check): %v %v; want both renewed for 2s", batch[1].TTL, batch[1].Err, batch[2].TTL, batch[2].Err)
	}

	// The timers rebuilt between the check and the renewal (a restore): they are looked up again, so the
	// renewal moves the live timer's deadline, not the discarded one's.
	batch = []Renewal{{Resource: "kept", Token: kept}}
	if gen, err = l.CheckRenewals(batch); err != nil {
		t.Fatal(err)
	}
	old := batch[0].t
	l.Reset(s.sm, s.clock.Now())
	s.clock.Advance(time.Second)
	at := s.clock.Now()
	if err := l.RenewChecked(gen, batch, at); err != nil || batch[0].Err != nil {
		t.Fatalf("kept after a reset: %v, %v; want renewed", err, batch[0].Err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if live := l.current("kept", kept); live == old || live.renewedAt != l.at(at) {
		t.Errorf("the renewal after a reset did not reach the live timer (same object %v, renewed at %v, want %v)",
			live == old, live.renewedAt, l.at(at))
	}
}

// TestMassExpiryKeepsToTheExpiryRate: a thousand leases due at once are expired at the expiry rate, the
// most overdue first, not in one go; none is left behind.
func TestMassExpiryKeepsToTheExpiryRate(t *testing.T) {
	const (
		rate, batch, n = 2000, 100, 1000
		tick           = 10 * time.Millisecond
	)
	cfg := testConfig()
	cfg.ExpiryRate, cfg.ExpiryBatch = rate, batch // bursts of 200
	s := newLessorSim(t, 1, cfg)
	s.elect(0)
	s.apply(acquireCmd("first", 900*time.Millisecond)) // the most overdue
	for i := range n - 1 {
		s.apply(acquireCmd(fmt.Sprintf("r/%04d", i), time.Second))
	}
	s.step(time.Second, tick)
	if _, ok := s.expired["first"]; !ok {
		t.Fatal("the most overdue lease was not among the first expired")
	}
	due := s.clock.Now() // the 999 are due at this tick
	for {
		elapsed := s.clock.Now().Sub(due)
		if most := 1 + 200 + int(rate*elapsed.Seconds()); len(s.expired) > most { // first, a burst, the rate since
			t.Fatalf("%d leases expired %v after they were due; the rate allows at most %d", len(s.expired), elapsed, most)
		}
		if len(s.expired) == n {
			return
		}
		if elapsed > time.Second {
			t.Fatalf("only %d of %d leases expired %v after they were due (rate %d/s)", len(s.expired), n, elapsed, rate)
		}
		s.step(tick, tick)
	}
}

// TestLessorCommandsGoToTheLogInNameOrder: an expiry or checkpoint decision naming many leases becomes
// entries of at most the batch, its leases in name order (then token), none lost or repeated; a command
// without a batch goes as it is.
func TestLessorCommandsGoToTheLogInNameOrder(t *testing.T) {
	names := []string{"m", "b", "z", "a", "q", "b", "c"}
	var refs []*leasepb.LeaseRef
	var cps []*wirepb.LeaseCheckpoint
	for i, r := range names {
		refs = append(refs, &leasepb.LeaseRef{Resource: r, Token: uint64(10 - i)})
		cps = append(cps, &wirepb.LeaseCheckpoint{Resource: r, Token: uint64(10 - i), RemainingMs: int64(i)})
	}
	want := "a/7 b/5 b/9 | c/4 m/10 q/6 | z/8"
	expire := Cmd{Cmd: &wirepb.Command{Op: &wirepb.Command_Expire{Expire: &wirepb.ExpireCmd{Leases: refs}}}, Batch: 3}
	checkpoint := Cmd{Cmd: &wirepb.Command{Op: &wirepb.Command_Checkpoint{Checkpoint: &wirepb.CheckpointCmd{Leases: cps}}}, Batch: 3}
	for _, c := range []Cmd{expire, checkpoint} {
		var entries []string
		for _, e := range c.Entries() {
			var leases []string
			for _, r := range e.GetExpire().GetLeases() {
				leases = append(leases, fmt.Sprintf("%s/%d", r.GetResource(), r.GetToken()))
			}
			for _, cp := range e.GetCheckpoint().GetLeases() {
				leases = append(leases, fmt.Sprintf("%s/%d", cp.GetResource(), cp.GetToken()))
			}
			entries = append(entries, strings.Join(leases, " "))
		}
		if got := strings.Join(entries, " | "); got != want {
			t.Errorf("%T entries: %s, want %s", c.Cmd.GetOp(), got, want)
		}
	}
	whole := Cmd{Cmd: &wirepb.Command{Op: &wirepb.Command_Expire{Expire: &wirepb.ExpireCmd{Leases: refs}}}}
	if got := whole.Entries(); len(got) != 1 || got[0] != whole.Cmd {
		t.Errorf("a command without a batch became %d entries", len(got))
	}
}

// TestLostExpiryIsReproposedAndLagCountsFromTheDeadline: an expiry proposal that never applies is made
// again one retry period later, not before; meanwhile the lease shows no time left; and the lag reported
// when an expiry finally applies counts from the lease's deadline, not from the retry.
func TestLostExpiryIsReproposedAndLagCountsFromTheDeadline(t *testing.T) {
	out := make(chan Cmd, 16)
	l := New(testConfig(), out)
	var lags []float64
	l.expiryLag = func(seconds float64) { lags = append(lags, seconds) }
	start := time.Now()
	l.Promote(start, 1)
	l.add(start, fsm.Lease{Resource: "r", Token: 7, TTLMs: 1000})
	expiries := func() int {
		n := 0
		for len(out) > 0 {
			for _, cmd := range (<-out).Entries() {
				n += len(cmd.GetExpire().GetLeases())
			}
		}
		return n
	}
	first := start.Add(1100 * time.Millisecond)
	l.Tick(first)
	if n := expiries(); n != 1 {
		t.Fatalf("%d expiries proposed 100ms after the deadline, want 1", n)
	}
	if left := l.Remaining("r", 7, first); left != 0 {
		t.Fatalf("an expiring lease shows %v left", left)
	}
	l.Tick(first.Add(l.retry - time.Millisecond))
	if n := expiries(); n != 0 {
		t.Fatalf("the expiry was proposed again %v after the first, before the retry period", l.retry-time.Millisecond)
	}
	l.Tick(first.Add(l.retry))
	if n := expiries(); n != 1 {
		t.Fatalf("%d expiries proposed once the retry period passed, want 1", n)
	}
	applied := first.Add(l.retry + 50*time.Millisecond)
	l.Applied(applied, fsm.Result{Events: []fsm.Event{{Type: leasepb.EventType_EVENT_TYPE_EXPIRED, Lease: fsm.Lease{Resource: "r", Token: 7}}}})
	want := applied.Sub(start.Add(time.Second)).Seconds()
	if len(lags) != 1 || math.Abs(lags[0]-want) > 1e-9 {
		t.Fatalf("expiry lag reported %v, want [%v]: from the deadline", lags, want)
	}
}

// TestQuorumOutageCountsInFull states the bound on a dead holder's lease across a quorum outage
// (docs/design.md, "Leader changes"): time the cluster spends without a leader counts in full. Renewals
// live in the leader's memory, so the leader after the outage cannot tell how long ago a lease was last
// renewed: a lease not yet marked idle in the log when the outage began gets a full TTL from the takeover,
// and an idle one its remainder from when the new leader applied the mark (or restarted). So a dead
// holder's lease ends within max(last renewal + TTL + interval, end of the outage + TTL) + the election
// gap. With an 8 s TTL and a 40 s outage 2 s after the grant, that is about 51 s after the grant, not the
// 14 s that TTL + interval + election gives without an outage; a lease whose idle mark was in the log
// before the outage ends with the takeover.
func TestQuorumOutageCountsInFull(t *testing.T) {
	const (
		ttl      = 8 * time.Second
		interval = 5 * time.Second
		outage   = 40 * time.Second
		tick     = 100 * time.Millisecond
	)
	cfg := testConfig()
	cfg.CheckpointInterval = interval
	election := 10 * tick
	cfg.Retry = 2 * election
	for _, restarted := range []bool{false, true} {
		t.Run(fmt.Sprintf("new leader restarted %v", restarted), func(t *testing.T) {
			s := newLessorSim(t, 3, cfg)
			s.elect(0)
			markedTok := s.apply(acquireCmd("marked", ttl)).Lease.Token // early enough for its idle mark to be in the log
			s.step(interval, tick)
			granted := s.clock.Now()
			freshTok := s.apply(acquireCmd("fresh", ttl)).Lease.Token // its idle mark is not yet due when the outage begins
			s.step(2*time.Second, tick)
			if marked, fresh := s.lessors[1].current("marked", markedTok), s.lessors[1].current("fresh", freshTok); !marked.idle || fresh.idle {
				t.Fatalf("setup: idle in the log before the outage: marked %v, fresh %v; want true, false", marked.idle, fresh.idle)
			}

			// Quorum lost: the leader steps down (CheckQuorum) and no entry commits for the outage.
			s.lessors[s.leader].Demote()
			s.leader = -1
			s.clock.Advance(outage)
			if restarted { // the node that leads next was restarted during the outage: it rebuilds its lessor
				s.lessors[1].Reset(s.sm, s.clock.Now())
			}
			quorumBack := s.clock.Now()
			s.step(election, tick)
			s.elect(1)
			s.step(ttl+interval+election, tick)

			for _, r := range []string{"marked", "fresh"} {
				if _, ok := s.expired[r]; !ok {
					t.Fatalf("%q was never expired after the outage", r)
				}
			}
			bound := quorumBack.Add(ttl + election + tick)
			if at := s.expired["fresh"]; at.After(bound) {
				t.Errorf("the lease granted before the outage expired at %v after quorum returned, bound TTL + election gap = %v",
					at.Sub(quorumBack), ttl+election)
			} else {
				t.Logf("the lease granted %v before the outage began expired %v after its grant (%v without the outage)",
					2*time.Second, s.expired["fresh"].Sub(granted), ttl+interval+election)
			}
			if at, takeover := s.expired["marked"], quorumBack.Add(election); at.After(bound) || (!restarted && at.After(takeover.Add(2*tick))) {
				t.Errorf("the lease marked idle before the outage expired %v after quorum returned", at.Sub(quorumBack))
			}
		})
	}
}
