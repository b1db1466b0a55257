package server

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server/internal/sim"
)

func leaderHintOf(err error) *leasepb.LeaderHint {
	for _, d := range status.Convert(err).Details() {
		if h, ok := d.(*leasepb.LeaderHint); ok {
			return h
		}
	}
	return nil
}

func leaseEndedOf(err error) *leasepb.LeaseEnded {
	for _, d := range status.Convert(err).Details() {
		if e, ok := d.(*leasepb.LeaseEnded); ok {
			return e
		}
	}
	return nil
}

// TestSimReleaseWhoseAnswerIsLostIsAcknowledgedOnRetry is issue #11's story: the leader proposes a
// release, its followers receive the entry but their acknowledgements are lost, so the leader steps down
// before it applies and answers "outcome unknown". The next leader commits the entry: the release took
// effect. The caller's retry must be answered OK (already released), not NotFound.
func TestSimReleaseWhoseAnswerIsLostIsAcknowledgedOnRetry(t *testing.T) {
	runSim(t, 3, nil, func(t *testing.T, c *simCluster) {
		ctx := context.Background()
		old := c.waitLeader(10 * time.Second)
		got, err := c.acquire(ctx, func(int) int { return old }, &leasepb.AcquireRequest{
			Resource: "jobs/report", Holder: "h", TtlMs: 60_000, RequestId: "a"})
		if err != nil {
			t.Fatal(err)
		}
		tok := got.GetLease().GetToken()
		// The followers hear the leader (they get the entry and keep following it) but it never hears
		// them: it cannot commit, and CheckQuorum makes it step down.
		for i := range c.size() {
			if i != old {
				c.net.CutOneWay(c.id(i), c.id(old))
			}
		}
		callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = c.leases(old).Release(callCtx, &leasepb.ReleaseRequest{Resource: "jobs/report", Token: tok})
		cancel()
		if code := status.Code(err); code != codes.Unavailable || !leaderHintOf(err).GetOutcomeUnknown() {
			t.Fatalf("first release = %v (hint %v), want Unavailable with outcome_unknown", err, leaderHintOf(err))
		}
		c.net.Heal()
		leader := c.waitLeader(10 * time.Second)
		c.converge(10 * time.Second)
		if c.holds(leader, "jobs/report") != 0 {
			t.Skipf("the release entry did not survive the leader change (seed %d): nothing to retry", c.seed)
		}
		resp, err := c.leases(leader).Release(ctx, &leasepb.ReleaseRequest{Resource: "jobs/report", Token: tok})
		if err != nil {
			t.Fatalf("retried release = %v, want OK: the first attempt released the lease", err)
		}
		if !resp.GetAlreadyReleased() || resp.GetReleasedIndex() <= tok {
			t.Fatalf("retried release = %v, want already_released with the index that released it", resp)
		}
	})
}

// TestSimReleaseAfterExpirySaysItExpired: a release that comes after the lease expired did not take
// effect, and the answer says so (NotFound with LeaseEnded.how = EXPIRED).
func TestSimReleaseAfterExpirySaysItExpired(t *testing.T) {
	runSim(t, 3, nil, func(t *testing.T, c *simCluster) {
		ctx := context.Background()
		l := c.waitLeader(10 * time.Second)
		got, err := c.acquire(ctx, func(int) int { return l }, &leasepb.AcquireRequest{
			Resource: "jobs/short", Holder: "h", TtlMs: simConfig().TTLFloor().Milliseconds(), RequestId: "a"}) // the floor
		if err != nil {
			t.Fatal(err)
		}
		tok := got.GetLease().GetToken()
		c.waitFor(10*time.Second, "expiry", func() bool { return c.holds(l, "jobs/short") == 0 })
		_, err = c.leases(l).Release(ctx, &leasepb.ReleaseRequest{Resource: "jobs/short", Token: tok})
		end := leaseEndedOf(err)
		if status.Code(err) != codes.NotFound || end.GetHow() != leasepb.EventType_EVENT_TYPE_EXPIRED || end.GetIndex() <= tok || end.GetForgotten() {
			t.Fatalf("release after expiry = %v (detail %v), want NotFound saying it expired", err, end)
		}
		// A token that never was a grant of the resource: NotFound, and definite (not forgotten).
		_, err = c.leases(l).Release(ctx, &leasepb.ReleaseRequest{Resource: "jobs/short", Token: tok + 1000})
		if end := leaseEndedOf(err); status.Code(err) != codes.NotFound || end == nil || end.GetHow() != leasepb.EventType_EVENT_TYPE_UNSPECIFIED || end.GetForgotten() {
			t.Fatalf("release of a token never granted = %v (detail %v)", err, end)
		}
	})
}

// TestSimRenewOnANewLeaderThatHasNotAppliedTheGrantYet: a leader that just took over may not have applied
// a grant its predecessor committed and acknowledged (it learns that the entry is committed only once an
// entry of its own term commits). A renewal that reaches it in that window must not be answered "gone":
// that is a definite "lost" for a lease that is alive. Not current is decided only after the leadership
// confirmation, which waits until the node has applied everything committed before it.
func TestSimRenewOnANewLeaderThatHasNotAppliedTheGrantYet(t *testing.T) {
	runSim(t, 3, nil, func(t *testing.T, c *simCluster) {
		ctx := context.Background()
		old := c.waitLeader(10 * time.Second)
		const d = 30 * time.Millisecond
		c.net.SetFaults(sim.Faults{MinDelay: d, MaxDelay: d}) // every message takes d: a fixed schedule
		acquired := make(chan uint64, 1)
		go func() {
			resp, err := c.leases(old).Acquire(ctx, &leasepb.AcquireRequest{Resource: "svc/primary", Holder: "h", TtlMs: 60_000, RequestId: "a"})
			if err != nil {
				t.Errorf("acquire: %v", err)
			}
			acquired <- resp.GetLease().GetToken()
		}()
		// The entry reaches the followers at d and their acknowledgements the leader at 2d, when it
		// commits; cut it off in between, so that no follower learns the entry is committed.
		time.Sleep(d + d/2)
		for i := range c.size() {
			if i != old {
				c.net.CutOneWay(c.id(old), c.id(i))
			}
		}
		tok := <-acquired
		c.net.Isolate(c.id(old))
		if tok == 0 {
			t.Fatal("no grant")
		}
		var leader int
		c.waitFor(10*time.Second, "a new leader", func() bool {
			for i := range c.size() {
				if i != old && c.node(i).raft.IsLeader() {
					leader = i
					return true
				}
			}
			return false
		})
		if c.holds(leader, "svc/primary") == tok {
			t.Skipf("the new leader had applied the grant already (seed %d): the window was missed", c.seed)
		}
		// Renew as a client would: retry answers that say nothing (Unavailable) until a definite one.
		var (
			resp *leasepb.RenewResponse
			err  error
		)
		deadline := time.Now().Add(10 * time.Second)
		for attempt := 0; ; attempt++ {
			i := leader
			if attempt > 0 {
				i = c.leader()
			}
			if i >= 0 && i != old {
				callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
				resp, err = c.leases(i).Renew(callCtx, &leasepb.RenewRequest{Resource: "svc/primary", Token: tok})
				cancel()
				if !retryable(err) {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("no definite answer to the renewal: %v", err)
			}
			time.Sleep(c.tick())
		}
		if err != nil || resp.GetTtlMs() != 60_000 {
			t.Fatalf("renew on the new leader = %v, %v; want the lease renewed (it is alive)", resp, err)
		}
		c.net.SetFaults(sim.Faults{})
		c.net.Heal()
	})
}
