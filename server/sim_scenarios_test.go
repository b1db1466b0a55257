package server

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/server/internal/sim"
)

// TestSimLeaderLoss: the leader is cut off from both followers. The majority elects a new leader and an
// acquire through it succeeds within the election timeout plus 2 s (L1); the old leader grants nothing.
func TestSimLeaderLoss(t *testing.T) {
	runSim(t, 3, nil, func(t *testing.T, c *simCluster) {
		ctx := context.Background()
		old := c.waitLeader(10 * time.Second)
		if _, err := c.acquire(ctx, func(int) int { return old }, &leasepb.AcquireRequest{
			Resource: "before", Holder: "h", TtlMs: 60_000, RequestId: "before"}); err != nil {
			t.Fatal(err)
		}
		c.net.Isolate(c.id(old))
		cutAt := time.Now()
		other := (old + 1) % c.size()
		resp, err := c.acquire(ctx, func(int) int { return other }, &leasepb.AcquireRequest{
			Resource: "after", Holder: "h", TtlMs: 60_000, RequestId: "after"})
		if err != nil {
			t.Fatal(err)
		}
		took := time.Since(cutAt)
		bound := c.cfgs[0].ElectionTimeout() + 2*time.Second
		t.Logf("acquire on the majority succeeded %v after the leader was cut off (bound %v)", took, bound)
		if took > bound {
			t.Fatalf("acquire took %v after the leader was cut off, bound %v", took, bound)
		}
		if l := c.leader(); l < 0 || l == old {
			t.Fatalf("leader after the cut: %d (old %d)", l, old)
		}
		// The old leader cannot grant: not before it notices (no quorum to commit), nor after.
		octx, cancel := context.WithTimeout(ctx, 2*c.cfgs[0].ElectionTimeout())
		_, err = c.leases(old).Acquire(octx, &leasepb.AcquireRequest{Resource: "stale", Holder: "h", TtlMs: 60_000, RequestId: "stale"})
		cancel()
		if err == nil {
			t.Fatal("the cut-off old leader granted a lease")
		}
		if c.node(old).raft.IsLeader() {
			t.Fatal("the cut-off old leader still believes it leads after two election timeouts (CheckQuorum)")
		}
		if c.holds(old, "stale") != 0 {
			t.Fatal("the cut-off old leader applied a grant")
		}
		c.net.Heal()
		c.waitLeader(10 * time.Second)
		c.converge(10 * time.Second)
		if tok := c.holds(old, "after"); tok != resp.GetLease().GetToken() {
			t.Fatalf("after healing, the old leader sees token %d for the majority's grant %d", tok, resp.GetLease().GetToken())
		}
	})
}

// TestSimPartitionsKeepTokensAndGrantsSafe runs clients that acquire, hold and release (or abandon)
// a few hot resources through random nodes, while a seeded schedule isolates nodes, cuts pairs and
// one-way links, crashes a node and restarts it on what it persisted, and heals, over a network that
// also drops, delays and reorders messages. Afterwards:
// I1 and I2 hold along every node's log, every acknowledged grant is in the log with its holder, and
// every node's state machine is byte-identical to the others' and to a replay of its own log.
//
// With the FSM planted to grant a held resource to another holder, it fails at once with "I2: r1
// granted at 9 while token 8 is live" (tried locally, not committed).
func TestSimPartitionsKeepTokensAndGrantsSafe(t *testing.T) {
	runSim(t, 3, func(cfg *Config) { cfg.SnapshotEntries = 1 << 30 }, func(t *testing.T, c *simCluster) {
		const (
			clients  = 4
			duration = 20 * time.Second
		)
		c.waitLeader(10 * time.Second)
		c.net.SetFaults(sim.Faults{Drop: 0.05, MaxDelay: 3 * c.tick()})
		type ack struct {
			resource, holder, requestID string
			token                       uint64
		}
		var (
			mu   sync.Mutex
			acks []ack
			wg   sync.WaitGroup
		)
		floor := c.cfgs[0].TTLFloor().Milliseconds()
		ctx, stop := context.WithCancel(context.Background())
		for w := range clients {
			rng := rand.New(rand.NewPCG(c.seed, uint64(100+w)))
			wg.Add(1)
			go func() {
				defer wg.Done()
				holder := fmt.Sprintf("w%d", w)
				for k := 0; ctx.Err() == nil; k++ {
					resource := fmt.Sprintf("r%d", rng.IntN(5))
					req := &leasepb.AcquireRequest{Resource: resource, Holder: holder, TtlMs: floor + rng.Int64N(1000), // from the TTL floor
						RequestId: fmt.Sprintf("%s-%d", holder, k)}
					svc := c.leases(rng.IntN(c.size()))
					if svc == nil { // stopped: the client tries another node
						time.Sleep(c.tick())
						continue
					}
					callCtx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
					resp, err := svc.Acquire(callCtx, req)
					cancel()
					if err != nil {
						time.Sleep(time.Duration(rng.IntN(100)) * time.Millisecond)
						continue
					}
					mu.Lock()
					acks = append(acks, ack{resource, holder, req.RequestId, resp.GetLease().GetToken()})
					mu.Unlock()
					time.Sleep(time.Duration(rng.IntN(400)) * time.Millisecond)
					if rng.IntN(4) == 0 {
						continue // abandoned: the lease must expire
					}
					if svc = c.leases(rng.IntN(c.size())); svc != nil {
						callCtx, cancel = context.WithTimeout(ctx, 500*time.Millisecond)
						_, _ = svc.Release(callCtx, &leasepb.ReleaseRequest{Resource: resource, Token: resp.GetLease().GetToken()})
						cancel()
					}
				}
			}()
		}
		faults := map[string]int{}
		crashed := -1
		for end := time.Now().Add(duration); time.Now().Before(end); {
			a, b := c.id(c.rng.IntN(3)), c.id(c.rng.IntN(3))
			switch k := c.rng.IntN(7); {
			case k == 0:
				c.net.Heal()
				faults["heal"]++
			case k == 1 && c.leader() >= 0:
				c.net.Heal()
				c.net.Isolate(c.id(c.leader()))
				faults["isolate-leader"]++
			case k == 2:
				c.net.Heal()
				c.net.Isolate(a)
				faults["isolate"]++
			case k == 3 && a != b:
				c.net.Cut(a, b) // the third node still sees both: a "bridge"
				faults["cut-pair"]++
			case k == 4 && a != b:
				c.net.CutOneWay(a, b)
				faults["cut-one-way"]++
			case k == 5 && crashed < 0:
				// A crash: the node is cut off and stopped, then restarted later on what it persisted.
				crashed = c.rng.IntN(c.size())
				c.stop(crashed, true)
				faults["crash"]++
			case k == 5:
				c.start(crashed)
				crashed = -1
				faults["restart"]++
			default:
				faults["none"]++ // a ~1 in 6 chance per step of keeping the current faults
			}
			time.Sleep(time.Duration(300+c.rng.IntN(1200)) * time.Millisecond)
		}
		c.net.Heal()
		if crashed >= 0 {
			c.start(crashed)
		}
		// Healed, the workload goes on, and the checks below are not vacuous: it must get five more grants
		// acknowledged, and ten in all. Counted here rather than during the faults: a schedule that keeps
		// the cluster split most of the time acknowledges few there (one CI run had 4 in 20 s).
		acked := func() int {
			mu.Lock()
			defer mu.Unlock()
			return len(acks)
		}
		want := max(10, acked()+5)
		c.waitFor(10*time.Second, fmt.Sprintf("%d acknowledged grants once healed", want), func() bool { return acked() >= want })
		stop()
		wg.Wait()
		c.net.SetFaults(sim.Faults{})
		t.Logf("faults: %v; acknowledged grants: %d", faults, len(acks))
		c.waitLeader(10 * time.Second)
		at := c.converge(20 * time.Second)
		var grants map[uint64]grantRecord
		for i := range c.size() {
			g, replayed := c.replayLog(i, at)
			if _, live := c.fsmState(i); !bytes.Equal(replayed, live) {
				t.Fatalf("%s: a replay of its log to %d differs from its state machine", c.cfgs[i].Name, at)
			}
			if grants == nil {
				grants = g
			}
		}
		for _, a := range acks {
			g, ok := grants[a.token]
			if !ok || g.resource != a.resource || g.holder != a.holder || g.requestID != a.requestID {
				t.Fatalf("acknowledged grant %+v is not in the log as granted (log has %+v)", a, g)
			}
		}
	})
}

// moveLeadership moves leadership away from the current leader, either by a leadership transfer to
// another node or by isolating the leader until the others elect a new one (then healing), and waits
// for the new leader. It returns the new leader.
func (c *simCluster) moveLeadership(isolate bool) int {
	c.t.Helper()
	old := c.waitLeader(10 * time.Second)
	if isolate {
		c.net.Isolate(c.id(old))
	} else {
		to := (old + 1 + c.rng.IntN(c.size()-1)) % c.size()
		c.node(old).raft.TransferLeadership(context.Background(), c.id(old), c.id(to))
	}
	l := -1
	c.waitFor(10*time.Second, "a new leader", func() bool {
		l = c.leader()
		return l >= 0 && l != old
	})
	c.net.Heal()
	return l
}

// TestSimDeadLeaseBoundAcrossLeaderFlaps is decision 3's bound on whole nodes: with leadership moved
// every TTL/2 (by transfer, or by isolating the leader until the others elect one), a lease whose holder
// died right after acquiring is expired within a bound of its grant, while a lease whose holder keeps
// renewing (through whichever node it reaches) is never lost.
//
// The bound is the contract's, TTL + checkpoint interval + election gap, where the election gap (how long
// the cluster may go without a leader after one is lost) is raft's randomized election timeout, under
// 2 x ElectionTicks x TickInterval, plus a few ticks for the new leader's replication and apply and for
// the monitor's sampling (docs/design.md, "The lessor"). An election that fails (a split vote between the
// two nodes left by an isolation) takes another round; such a move's measured gap replaces the bound's.
// Before the lessor marked leases idle within one interval of their last renewal, seeds where the first
// move fell just before the leader's second checkpoint took TTL + ~2 intervals + election gaps (e.g.
// seed 13978620333226912874).
//
// It is a real check: with startDeadlines planted to give every lease a full TTL at every takeover (as
// etcd's lessor does), the dead lease outlives every leader and the test fails with "never expired".
func TestSimDeadLeaseBoundAcrossLeaderFlaps(t *testing.T) {
	const ttl = 4 * time.Second
	runSim(t, 3, func(cfg *Config) {
		cfg.TickInterval, cfg.ElectionTicks = 50*time.Millisecond, 10
		cfg.CheckpointInterval = time.Second
	}, func(t *testing.T, c *simCluster) {
		cfg := c.cfgs[0]
		electionGap := 2*cfg.ElectionTimeout() + 4*cfg.TickInterval
		bound := ttl + cfg.CheckpointInterval + electionGap
		ctx := context.Background()
		l := c.waitLeader(10 * time.Second)
		alive, err := c.acquire(ctx, func(int) int { return l }, &leasepb.AcquireRequest{Resource: "alive", Holder: "a", TtlMs: ttl.Milliseconds(), RequestId: "a"})
		if err != nil {
			t.Fatal(err)
		}
		grantedAt := time.Now()
		if _, err := c.acquire(ctx, func(int) int { return l }, &leasepb.AcquireRequest{Resource: "dead", Holder: "d", TtlMs: ttl.Milliseconds(), RequestId: "d"}); err != nil {
			t.Fatal(err)
		}

		// The live holder renews every 500 ms through a random node; the monitor watches every node's
		// state machine each tick.
		rctx, stop := context.WithCancel(ctx)
		var (
			wg        sync.WaitGroup
			mu        sync.Mutex
			expiredAt time.Time
			lostAlive bool
		)
		wg.Add(2)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(c.seed, 7))
			for rctx.Err() == nil {
				callCtx, cancel := context.WithTimeout(rctx, 400*time.Millisecond)
				_, _ = c.leases(rng.IntN(c.size())).Renew(callCtx, &leasepb.RenewRequest{Resource: "alive", Token: alive.GetLease().GetToken()})
				cancel()
				time.Sleep(500 * time.Millisecond)
			}
		}()
		go func() {
			defer wg.Done()
			// A node judges a lease only once it has applied its grant (followers may lag).
			sawDead, sawAlive := make([]bool, c.size()), make([]bool, c.size())
			for rctx.Err() == nil {
				for i := range c.size() {
					dead, live := c.holds(i, "dead"), c.holds(i, "alive")
					mu.Lock()
					if dead != 0 {
						sawDead[i] = true
					} else if sawDead[i] && expiredAt.IsZero() {
						expiredAt = time.Now()
					}
					if live == alive.GetLease().GetToken() {
						sawAlive[i] = true
					} else if sawAlive[i] {
						lostAlive = true
					}
					mu.Unlock()
				}
				time.Sleep(cfg.TickInterval)
			}
		}()
		// The first move comes at a random point of the lessor's checkpoint cycle, then one every TTL/2.
		// Each move's leaderless time is measured: an election that fails (a split vote between the two
		// nodes left when the leader is isolated) takes another randomized timeout, which raft, not the
		// lessor, adds to the gap.
		type move struct {
			at  time.Time
			gap time.Duration
		}
		var moves []move
		time.Sleep(time.Duration(c.rng.Int64N(int64(ttl / 2))))
		for end := grantedAt.Add(3 * bound); time.Now().Before(end); {
			start := time.Now()
			c.moveLeadership(c.rng.IntN(2) == 0)
			moves = append(moves, move{start, time.Since(start)})
			time.Sleep(ttl / 2)
		}
		stop()
		wg.Wait()
		if lostAlive {
			t.Fatal("the lease whose holder kept renewing was lost")
		}
		if expiredAt.IsZero() {
			t.Fatalf("the dead holder's lease was never expired across %d leader changes: leadership churn made it immortal", len(moves))
		}
		for _, m := range moves {
			if m.at.Before(expiredAt) && m.gap+4*cfg.TickInterval > electionGap {
				t.Logf("a move at %v took %v to elect a leader (more than one election round)", m.at.Sub(grantedAt), m.gap)
				bound = max(bound, ttl+cfg.CheckpointInterval+m.gap+4*cfg.TickInterval)
			}
		}
		took := expiredAt.Sub(grantedAt)
		t.Logf("dead lease expired %v after its grant, across %d leader changes (bound %v)", took, len(moves), bound)
		if took > bound {
			t.Fatalf("dead lease expired %v after its grant, bound %v", took, bound)
		}
	})
}

// TestSimStalledLeaderDoesNotMassExpire: the leader's disk stops answering for 1.5 s — longer than the
// leases' 1 s TTL, shorter than the election timeout, so it stays leader — while the holders keep trying
// to renew (and fail: the leader's loop is blocked). When the write completes, the loop sees the gap in
// its ticks and extends every deadline by it before expiring anything: no lease is lost, and renewals
// resume. With the extension removed from node.tick, every lease is expired at once when the loop
// resumes and the test fails.
func TestSimStalledLeaderDoesNotMassExpire(t *testing.T) {
	const (
		ttl    = time.Second
		stall  = 1500 * time.Millisecond
		leases = 20
	)
	runSim(t, 3, func(cfg *Config) {
		cfg.TickInterval, cfg.ElectionTicks = 50*time.Millisecond, 40 // 2 s: the stall causes no election
		// A TTL shorter than a stall that causes no election is below the TTL floor (10 s here): this
		// test isolates the lessor's stall extension, which only matters there.
		cfg.Limits.MinTTL, cfg.belowTTLFloor = ttl, true
	}, func(t *testing.T, c *simCluster) {
		ctx := context.Background()
		l := c.waitLeader(20 * time.Second)
		term := c.node(l).raft.Term()
		refs := make([]*leasepb.LeaseRef, leases)
		for k := range refs {
			r := fmt.Sprintf("held/%d", k)
			resp, err := c.acquire(ctx, func(int) int { return l }, &leasepb.AcquireRequest{Resource: r, Holder: "h", TtlMs: ttl.Milliseconds(), RequestId: r})
			if err != nil {
				t.Fatal(err)
			}
			refs[k] = &leasepb.LeaseRef{Resource: r, Token: resp.GetLease().GetToken()}
		}
		rctx, stop := context.WithCancel(ctx)
		var (
			wg                sync.WaitGroup
			mu                sync.Mutex
			lost              []string
			renewed, failures int
		)
		wg.Add(2)
		go func() { // the holders: one KeepAlive for all leases every 250 ms, through a random node
			defer wg.Done()
			rng := rand.New(rand.NewPCG(c.seed, 9))
			for rctx.Err() == nil {
				callCtx, cancel := context.WithTimeout(rctx, 200*time.Millisecond)
				// write: the node's one path for writes, which forwards from a follower to the leader.
				_, err := c.node(rng.IntN(c.size())).ops.Write(callCtx, &wirepb.ForwardRequest{
					Request: &wirepb.ForwardRequest_KeepAlive{KeepAlive: &leasepb.KeepAliveRequest{Leases: refs}}})
				cancel()
				mu.Lock()
				if err == nil {
					renewed++
				} else {
					failures++
				}
				mu.Unlock()
				time.Sleep(250 * time.Millisecond)
			}
		}()
		go func() { // every tick, on every node that has applied a grant: is it still there?
			defer wg.Done()
			seen := make([][]bool, c.size())
			for i := range seen {
				seen[i] = make([]bool, leases)
			}
			for rctx.Err() == nil {
				for i := range c.size() {
					for k, ref := range refs {
						if c.holds(i, ref.Resource) == ref.Token {
							seen[i][k] = true
						} else if seen[i][k] {
							mu.Lock()
							lost = append(lost, fmt.Sprintf("%s on %s at %v", ref.Resource, c.cfgs[i].Name, time.Now().Format("15:04:05.000")))
							seen[i][k] = false
							mu.Unlock()
						}
					}
				}
				time.Sleep(c.tick())
			}
		}()
		time.Sleep(2 * ttl) // renewals in steady state
		c.logs[l].Stall(stall)
		stalledAt := time.Now()
		if _, err := c.acquire(ctx, func(int) int { return l }, &leasepb.AcquireRequest{Resource: "trigger", Holder: "h", TtlMs: 60_000, RequestId: "trigger"}); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(stalledAt); took < stall {
			t.Fatalf("the write that should have stalled took %v", took)
		}
		mu.Lock()
		renewedBefore := renewed
		mu.Unlock()
		time.Sleep(3 * ttl) // renewals resume
		stop()
		wg.Wait()
		t.Logf("keep-alives: %d succeeded (%d after the stall), %d failed", renewed, renewed-renewedBefore, failures)
		if c.leader() != l || c.node(l).raft.Term() != term {
			t.Fatal("leadership changed: the stall was meant to stay below the election timeout")
		}
		if len(lost) > 0 {
			t.Fatalf("%d lease losses after a %v leader stall, first: %v", len(lost), stall, lost[:min(3, len(lost))])
		}
		if renewed-renewedBefore == 0 {
			t.Fatal("no renewal succeeded after the stall")
		}
	})
}

// TestSimCrashedFollowerCatchesUpBySnapshot: a follower crashes, the others compact their logs past it,
// and when it restarts on what it persisted it is sent a snapshot over the simulated network (with drops
// and delays) and converges byte-identical with the others.
func TestSimCrashedFollowerCatchesUpBySnapshot(t *testing.T) {
	runSim(t, 3, func(cfg *Config) { cfg.SnapshotEntries, cfg.SnapshotCatchUp = 50, 5 }, func(t *testing.T, c *simCluster) {
		ctx := context.Background()
		l := c.waitLeader(10 * time.Second)
		f := (l + 1) % c.size()
		for k := range 20 {
			r := fmt.Sprintf("a/%d", k)
			if _, err := c.acquire(ctx, func(int) int { return l }, &leasepb.AcquireRequest{Resource: r, Holder: "h", TtlMs: 600_000, RequestId: r}); err != nil {
				t.Fatal(err)
			}
		}
		c.stop(f, true)
		followerLast, _ := c.logs[f].LastIndex()
		c.net.SetFaults(sim.Faults{Drop: 0.05, MaxDelay: 2 * c.tick()})
		for k := range 300 {
			r := fmt.Sprintf("b/%d", k)
			if _, err := c.acquire(ctx, func(a int) int { return (l + 2*a) % c.size() }, &leasepb.AcquireRequest{Resource: r, Holder: "h", TtlMs: 600_000, RequestId: r}); err != nil {
				t.Fatal(err)
			}
		}
		if first, _ := c.logs[l].FirstIndex(); first <= followerLast+1 {
			t.Fatalf("setup: the leader's log starts at %d, the follower has entries up to %d", first, followerLast)
		}
		c.start(f)
		c.waitFor(20*time.Second, "a snapshot restored on the restarted follower", func() bool { return c.node(f).raft.Restores() > 0 })
		c.net.SetFaults(sim.Faults{})
		c.converge(20 * time.Second)
		for _, r := range []string{"a/0", "b/299"} {
			if c.holds(f, r) == 0 {
				t.Fatalf("the restarted follower does not hold %s", r)
			}
		}
	})
}
