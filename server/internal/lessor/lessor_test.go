package lessor

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server/internal/clock"
	"github.com/leased/leased/server/internal/errs"
)

// lessorSim drives the lessors of several nodes over one shared log, with a manual clock: whatever the
// current leader's lessor proposes is committed and applied on every node, as raft would.
type lessorSim struct {
	t       *testing.T
	clock   *clock.Manual
	sm      *fsm.FSM
	index   uint64
	out     chan Cmd
	lessors []*Lessor
	leader  int // -1: none
	term    uint64
	expired map[string]time.Time
}

func newLessorSim(t *testing.T, nodes int, cfg Config) *lessorSim {
	s := &lessorSim{t: t, clock: clock.NewManual(), sm: fsm.New(), out: make(chan Cmd, 1<<16), leader: -1, expired: map[string]time.Time{}}
	for range nodes {
		s.lessors = append(s.lessors, New(cfg, s.out))
	}
	return s
}

// applyAll applies the entries a proposer makes of c, in order.
func (s *lessorSim) applyAll(c Cmd) {
	for _, cmd := range c.Entries() {
		s.apply(cmd)
	}
}

func (s *lessorSim) apply(cmd *wirepb.Command) fsm.Result {
	s.index++
	res, err := s.sm.Apply(s.index, cmd)
	if err != nil {
		s.t.Fatal(err)
	}
	now := s.clock.Now()
	for _, l := range s.lessors {
		l.Applied(now, res)
	}
	for _, e := range res.Events {
		if e.Type == leasepb.EventType_EVENT_TYPE_EXPIRED {
			s.expired[e.Lease.Resource] = now
		}
	}
	return res
}

// step advances the clock by d in ticks of tick, letting the leader's lessor work and its proposals apply.
func (s *lessorSim) step(d, tick time.Duration) {
	for end := s.clock.Now().Add(d); s.clock.Now().Before(end); {
		s.clock.Advance(tick)
		if s.leader >= 0 {
			s.lessors[s.leader].Tick(s.clock.Now())
		}
		for len(s.out) > 0 {
			s.applyAll(<-s.out)
		}
	}
}

func (s *lessorSim) elect(i int) {
	if s.leader >= 0 {
		s.lessors[s.leader].Demote()
	}
	s.leader = i
	s.term++
	s.lessors[i].Promote(s.clock.Now(), s.term)
}

func (s *lessorSim) renew(resource string, token uint64) bool {
	l := s.lessors[s.leader]
	r, err := l.checkRenew(resource, token)
	if err != nil {
		return false
	}
	if r.idle {
		if res := s.apply(renew(resource, token)); len(res.Changes.Renewed) == 0 {
			return false
		}
	}
	_, err = l.renew(resource, token, s.clock.Now())
	return err == nil
}

// renewal is what checkRenew found: the lease's TTL, and whether its renewal must go through the log.
type renewal struct {
	ttl  time.Duration
	idle bool
}

// checkRenew reports whether (resource, token) can be renewed by this leader (checkRenewals of one).
func (l *Lessor) checkRenew(resource string, token uint64) (renewal, error) {
	batch := []Renewal{{Resource: resource, Token: token}}
	if _, err := l.CheckRenewals(batch); err != nil {
		return renewal{}, err
	}
	if batch[0].t == nil {
		return renewal{}, errs.ErrNotCurrent
	}
	return renewal{ttl: batch[0].t.ttl, idle: batch[0].Idle}, nil
}

// renew resets the deadline of (resource, token) to at + TTL (renewChecked of one, looked up afresh).
func (l *Lessor) renew(resource string, token uint64, at time.Time) (time.Duration, error) {
	batch := []Renewal{{Resource: resource, Token: token}}
	if err := l.RenewChecked(0, batch, at); err != nil {
		return 0, err
	}
	return batch[0].TTL, batch[0].Err
}

func renew(resource string, token uint64) *wirepb.Command {
	return &wirepb.Command{Op: &wirepb.Command_Renew{Renew: &wirepb.RenewCmd{Leases: []*leasepb.LeaseRef{{Resource: resource, Token: token}}}}}
}

func acquireCmd(resource string, ttl time.Duration) *wirepb.Command {
	return &wirepb.Command{Op: &wirepb.Command_Acquire{Acquire: &wirepb.AcquireCmd{
		Resource: resource, Holder: "h-" + resource, TtlMs: ttl.Milliseconds(),
	}}}
}

// TestDeadHolderExpiresDespiteLeadershipChurn is decision 3's bound: with leadership moving every TTL/2,
// a lease whose holder died is expired within TTL + checkpoint interval + election timeout, while a lease
// that keeps being renewed is never expired.
func TestDeadHolderExpiresDespiteLeadershipChurn(t *testing.T) {
	const (
		ttl      = 10 * time.Second
		interval = time.Second
		tick     = 100 * time.Millisecond
	)
	cfg := testConfig()
	cfg.CheckpointInterval = interval
	election := 10 * tick
	cfg.Retry = 2 * election
	s := newLessorSim(t, 3, cfg)
	s.elect(0)
	dead := s.apply(acquireCmd("dead", ttl)).Lease.Token
	alive := s.apply(acquireCmd("alive", ttl)).Lease.Token

	var died time.Time
	for round := 0; round < 12; round++ {
		// Each leader serves TTL/2, renewing "alive" every second (and "dead" until it dies at round 2).
		for elapsed := time.Duration(0); elapsed < ttl/2; elapsed += time.Second {
			if !s.renew("alive", alive) {
				t.Fatalf("round %d: the renewed lease was lost", round)
			}
			if round < 2 {
				if !s.renew("dead", dead) {
					t.Fatalf("round %d: dead's lease lost while its holder lived", round)
				}
				died = s.clock.Now()
			}
			s.step(time.Second, tick)
		}
		// Leadership moves: an election timeout without a leader, then the next node takes over.
		s.lessors[s.leader].Demote()
		s.leader = -1
		s.step(election, tick)
		s.elect((round + 1) % 3)
	}
	at, ok := s.expired["dead"]
	if !ok {
		t.Fatal("the dead holder's lease was never expired: leadership churn made it immortal")
	}
	bound := ttl + interval + election
	if took := at.Sub(died); took > bound+tick {
		t.Fatalf("expired %v after the last renewal, bound is %v", took, bound)
	}
	if _, lost := s.expired["alive"]; lost {
		t.Fatal("a renewed lease was expired")
	}
}

// TestNewLeaderNeverShortensRenewedLease: a lease renewed just before a leader change gets a full TTL
// from the new leader, even though its last checkpoint recorded less.
func TestNewLeaderNeverShortensRenewedLease(t *testing.T) {
	cfg := testConfig()
	cfg.CheckpointInterval = time.Second
	s := newLessorSim(t, 2, cfg)
	s.elect(0)
	tok := s.apply(acquireCmd("r", 4*time.Second)).Lease.Token
	s.step(1500*time.Millisecond, 100*time.Millisecond) // a checkpoint marks it idle with ~3s left
	if !s.renew("r", tok) {
		t.Fatal("renew failed")
	}
	renewedAt := s.clock.Now()
	s.elect(1)
	s.step(3900*time.Millisecond, 100*time.Millisecond)
	if _, gone := s.expired["r"]; gone {
		t.Fatalf("expired %v after a renewal with a 4s TTL", s.expired["r"].Sub(renewedAt))
	}
	s.step(2*time.Second, 100*time.Millisecond)
	if _, gone := s.expired["r"]; !gone {
		t.Fatal("never expired")
	}
}

// TestStalledLeaderDoesNotMassExpire: a gap in the leader's ticks extends every deadline by the gap.
func TestStalledLeaderDoesNotMassExpire(t *testing.T) {
	cfg := testConfig()
	s := newLessorSim(t, 1, cfg)
	s.elect(0)
	for i := range 100 {
		s.apply(acquireCmd(string(rune('a'+i%26))+string(rune('a'+i/26)), 2*time.Second))
	}
	s.step(time.Second, 10*time.Millisecond)
	// The loop stalls for 10s: the node notices the gap and extends deadlines before the next tick.
	s.clock.Advance(10 * time.Second)
	s.lessors[0].Extend(10 * time.Second)
	s.step(500*time.Millisecond, 10*time.Millisecond)
	if len(s.expired) != 0 {
		t.Fatalf("%d leases expired right after a stall", len(s.expired))
	}
	s.step(time.Second, 10*time.Millisecond)
	if len(s.expired) != 100 {
		t.Fatalf("%d of 100 leases expired after their (extended) TTL", len(s.expired))
	}
}

// TestLockDelayKeepsResourceUngrantable: after an expiry with a lock-delay, the resource is refused until
// the leader ends the delay.
func TestLockDelayEndsAfterDelay(t *testing.T) {
	cfg := testConfig()
	s := newLessorSim(t, 1, cfg)
	s.elect(0)
	s.apply(&wirepb.Command{Op: &wirepb.Command_Acquire{Acquire: &wirepb.AcquireCmd{Resource: "r", Holder: "h", TtlMs: 500, LockDelayMs: 2000}}})
	s.step(time.Second, 10*time.Millisecond)
	if _, ok := s.sm.LockDelayOf("r"); !ok {
		t.Fatal("no lock-delay after expiry")
	}
	if res := s.apply(acquireCmd("r", time.Second)); res.Code != fsm.LockDelayed {
		t.Fatalf("acquire during the delay = %v", res.Code)
	}
	s.step(1400*time.Millisecond, 10*time.Millisecond)
	if _, ok := s.sm.LockDelayOf("r"); !ok {
		t.Fatal("lock-delay ended early")
	}
	s.step(time.Second, 10*time.Millisecond)
	if _, ok := s.sm.LockDelayOf("r"); ok {
		t.Fatal("lock-delay never ended")
	}
}

// TestDurableRenewalAppliedAfterTakeoverEarnsFullTTL: the previous leader made an idle lease's renewal
// durable and acknowledged it; the entry applies on the new leader only after it took over with the lease
// counted as idle. The new leader must then give it a full TTL, not the checkpointed remainder.
func TestDurableRenewalAppliedAfterTakeoverEarnsFullTTL(t *testing.T) {
	cfg := testConfig()
	cfg.CheckpointInterval = time.Second
	s := newLessorSim(t, 2, cfg)
	s.elect(0)
	tok := s.apply(acquireCmd("r", 4*time.Second)).Lease.Token
	s.step(2500*time.Millisecond, 100*time.Millisecond) // checkpointed idle, ~2s left
	if !s.lessors[1].current("r", tok).idle {
		t.Fatal("setup: the lease should be idle in the log")
	}
	s.elect(1) // takes over: idle, so ~2s counted from the checkpoint
	s.apply(renew("r", tok))
	renewedAt := s.clock.Now()
	s.step(3800*time.Millisecond, 100*time.Millisecond)
	if at, gone := s.expired["r"]; gone {
		t.Fatalf("expired %v after a durable renewal with a 4s TTL", at.Sub(renewedAt))
	}
}

// TestIdleMarkDurableWithinOneInterval: whatever point of the leader's checkpoint cycle a lease was last
// renewed at, the log marks it idle (with its remaining TTL) within one checkpoint interval of that renewal;
// a follower that takes over then honours the remainder. With a mark only at the second checkpoint after
// the renewal, it took up to two intervals, and the dead-lease bound grew by one.
func TestIdleMarkDurableWithinOneInterval(t *testing.T) {
	const (
		ttl      = 10 * time.Second
		interval = time.Second
		tick     = 10 * time.Millisecond
	)
	cfg := testConfig()
	cfg.CheckpointInterval = interval
	for offset := time.Duration(0); offset < interval; offset += 70 * time.Millisecond {
		s := newLessorSim(t, 2, cfg)
		s.elect(0)
		tok := s.apply(acquireCmd("r", ttl)).Lease.Token
		s.step(2*interval+offset, tick)
		if !s.renew("r", tok) {
			t.Fatalf("offset %v: renew failed", offset)
		}
		renewedAt := s.clock.Now()
		for !s.lessors[1].current("r", tok).idle {
			if took := s.clock.Now().Sub(renewedAt); took > interval {
				t.Fatalf("offset %v: not marked idle in the log %v after the last renewal (interval %v)", offset, took, interval)
			}
			s.step(tick, tick)
		}
	}
}

// TestCheckpointInFlightMakesRenewalDurable: an idle checkpoint the leader has decided but that has not
// applied yet carries a remainder from before any renewal that follows. A renewal acknowledged from memory
// meanwhile would be undone when the checkpoint applies (the next leader would count the stale remainder),
// so until it applies renewals must go through the log.
func TestCheckpointInFlightMakesRenewalDurable(t *testing.T) {
	const (
		ttl  = 4 * time.Second
		tick = 10 * time.Millisecond
	)
	cfg := testConfig()
	cfg.CheckpointInterval = time.Second
	s := newLessorSim(t, 2, cfg)
	s.elect(0)
	tok := s.apply(acquireCmd("r", ttl)).Lease.Token
	// Tick the leader, without applying what it proposes, until it decides the idle checkpoint.
	for start := s.clock.Now(); len(s.out) == 0; {
		if s.clock.Now().Sub(start) > ttl/2 {
			t.Fatal("setup: no checkpoint decided")
		}
		s.clock.Advance(tick)
		s.lessors[0].Tick(s.clock.Now())
	}
	drain := func() {
		for len(s.out) > 0 {
			s.applyAll(<-s.out)
		}
	}
	if !s.renew("r", tok) { // refused while the checkpoint is on its way; once applied, renewed durably
		drain()
		if !s.renew("r", tok) {
			t.Fatal("renew failed after the checkpoint applied")
		}
	}
	renewedAt := s.clock.Now()
	drain()
	s.elect(1)
	s.step(ttl-2*tick, tick)
	if at, gone := s.expired["r"]; gone {
		t.Fatalf("expired %v after an acknowledged renewal with a %v TTL", at.Sub(renewedAt), ttl)
	}
}

// TestLessorReportsExpiryLag: the leader's lessor reports how late after its deadline it expired a lease
// (leased_expiry_lag_seconds): here the first tick after the deadline, 20 ms later; followers report nothing.
func TestLessorReportsExpiryLag(t *testing.T) {
	s := newLessorSim(t, 2, testConfig())
	lags := make([][]float64, 2)
	for i, l := range s.lessors {
		l.expiryLag = func(seconds float64) { lags[i] = append(lags[i], seconds) }
	}
	s.elect(0)
	s.apply(acquireCmd("late", time.Second))
	s.step(1100*time.Millisecond, 30*time.Millisecond) // ticks at 30 ms, ..., 990 ms, 1020 ms
	if _, ok := s.expired["late"]; !ok {
		t.Fatal("the lease was not expired")
	}
	if len(lags[0]) != 1 || len(lags[1]) != 0 {
		t.Fatalf("lags reported %v; want one on the leader, none on the follower", lags)
	}
	if got := time.Duration(lags[0][0] * float64(time.Second)); got < 19*time.Millisecond || got > 21*time.Millisecond {
		t.Errorf("expiry lag %v, want 20ms", got)
	}
}

// TestMonoAddSaturates: a deadline past the end of the lessor's clock saturates instead of wrapping to
// the past (which would expire the lease at once).
func TestMonoAddSaturates(t *testing.T) {
	if got := mono(math.MaxInt64 - 5).add(time.Hour); got != math.MaxInt64 {
		t.Fatalf("overflowing add = %d, want the clock's end", got)
	}
	if got := mono(10).add(-3); got != 7 {
		t.Fatalf("mono(10).add(-3) = %d", got)
	}
	l := &Lessor{}
	now := time.Now()
	if d := l.at(now).add(Millis(math.MaxInt64)); d <= l.at(now.Add(100*365*24*time.Hour)) {
		t.Fatalf("the longest TTL gives a deadline %d, before a century from now", d)
	}
}

// checkpointBacklog starts a leader whose idle checkpoints go one lease per command, grants n leases and
// ticks until it has decided a checkpoint for each, which it returns unapplied.
func checkpointBacklog(t *testing.T, n int) (*lessorSim, []*wirepb.Command) {
	cfg := testConfig()
	cfg.CheckpointInterval = time.Second
	cfg.ExpiryBatch = 1
	s := newLessorSim(t, 1, cfg)
	s.elect(0)
	for i := range n {
		s.apply(acquireCmd(fmt.Sprintf("r%d", i), time.Minute))
	}
	var cmds []*wirepb.Command
	for start := s.clock.Now(); len(cmds) < n; {
		if s.clock.Now().Sub(start) > cfg.CheckpointInterval {
			t.Fatalf("setup: %d checkpoints decided within an interval, want %d", len(cmds), n)
		}
		s.clock.Advance(10 * time.Millisecond)
		s.lessors[0].Tick(s.clock.Now())
		for len(s.out) > 0 {
			cmds = append(cmds, (<-s.out).Entries()...)
		}
	}
	return s, cmds
}

// TestCheckpointBacklogIsNotReproposed: checkpoints that apply more slowly than the retry period, one
// after another, are not proposed again while they are still applying: re-proposing a backlog (a leader
// taking over a million leases decides a thousand checkpoint entries at once) grows it faster than it
// drains, and no other write would apply.
func TestCheckpointBacklogIsNotReproposed(t *testing.T) {
	const n = 6
	s, backlog := checkpointBacklog(t, n)
	l := s.lessors[0]
	for _, c := range backlog {
		for range 4 { // retry/2 between applies: the backlog takes 3 retry periods to drain
			s.clock.Advance(l.retry / 8)
			l.Tick(s.clock.Now())
		}
		s.apply(c)
		if len(s.out) > 0 {
			t.Fatalf("a checkpoint still in the queue was proposed again: %v", (<-s.out).Cmd)
		}
	}
}

// TestLostCheckpointIsReproposed: a checkpoint that never reached the log (dropped) is proposed again as
// soon as one decided after it applies, and, when none applies at all, after the retry period.
func TestLostCheckpointIsReproposed(t *testing.T) {
	s, backlog := checkpointBacklog(t, 2)
	l := s.lessors[0]
	lost := backlog[0].GetCheckpoint().GetLeases()[0].GetResource()
	// Both were decided in one scan: a later scan's checkpoint must apply to show the first was lost.
	s.apply(backlog[1])
	s.clock.Advance(l.retry + l.scan) // a scan after the retry period
	l.Tick(s.clock.Now())
	if len(s.out) != 1 || (<-s.out).Cmd.GetCheckpoint().GetLeases()[0].GetResource() != lost {
		t.Fatalf("the lost checkpoint of %s was not proposed again after the retry period", lost)
	}
}
