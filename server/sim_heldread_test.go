package server

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
)

// TestSimFreshRefusalNeedsAQuorum: a held refusal answered from a read is confirmed by a quorum like the
// entry it replaces. A leader cut off from its followers still shows the resource held in its own
// state, and may no longer lead (the others can elect a leader that has freed it); before it steps down
// it must not answer "held" from that state. With the read's ReadIndex round skipped, it would.
func TestSimFreshRefusalNeedsAQuorum(t *testing.T) {
	runSim(t, 3, nil, func(t *testing.T, c *simCluster) {
		l := c.waitLeader(20 * time.Second)
		ctx := context.Background()
		if _, err := c.leases(l).Acquire(ctx, &leasepb.AcquireRequest{Resource: "r", Holder: "a", TtlMs: 60_000}); err != nil {
			t.Fatal(err)
		}
		c.net.Isolate(c.id(l))
		// Well within the election timeout: the isolated node still leads in its own eyes.
		actx, cancel := context.WithTimeout(ctx, c.tick()*time.Duration(c.cfgs[l].ElectionTicks)/4)
		defer cancel()
		_, err := c.leases(l).Acquire(actx, &leasepb.AcquireRequest{Resource: "r", Holder: "b", TtlMs: 60_000,
			RequestId: "qb", Attempt: 1, FreshRequestId: true})
		if status.Code(err) == codes.FailedPrecondition || err == nil {
			t.Fatalf("an isolated leader answered a fresh acquire of a held resource with %v; want no answer without a quorum", err)
		}
		c.net.Heal()
	})
}
