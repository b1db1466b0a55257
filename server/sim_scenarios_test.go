package server

import (
	"context"
	"testing"
	"time"

	"github.com/leased/leased/api/leasepb"
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
		if c.node(old).isLeader() {
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
