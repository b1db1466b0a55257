package server

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
)

// TestSimBatchWriteEndsAtItsOwnTimeout: each write of a Writes request is bounded by its own timeout_ms,
// as its own call would be by its deadline, while the others go on. The leader hears none of its
// followers, so nothing commits: the write with 50 ms ends DeadlineExceeded; the one bounded only by the
// stream runs
// until the leader steps down (CheckQuorum), and ends Unavailable with its outcome unknown.
func TestSimBatchWriteEndsAtItsOwnTimeout(t *testing.T) {
	runSim(t, 3, nil, func(t *testing.T, c *simCluster) {
		li := c.waitLeader(10 * time.Second)
		for i := range c.size() {
			if i != li {
				c.net.CutOneWay(c.id(i), c.id(li))
			}
		}
		acquire := func(resource string, timeoutMs uint32) *leasepb.BatchWrite {
			return &leasepb.BatchWrite{TimeoutMs: timeoutMs, Write: &leasepb.BatchWrite_Acquire{
				Acquire: &leasepb.AcquireRequest{Resource: resource, Holder: "h", TtlMs: 60_000}}}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		start := time.Now()
		results := c.leases(li).RunBatch(ctx, start, []*leasepb.BatchWrite{acquire("t/short", 50), acquire("t/call", 0)})
		short, long := status.FromProto(results[0].GetError()), status.FromProto(results[1].GetError())
		if short.Code() != codes.DeadlineExceeded {
			t.Errorf("the write with timeout_ms 50: %v, want DeadlineExceeded", short.Err())
		}
		if long.Code() != codes.Unavailable || !leaderHintOf(long.Err()).GetOutcomeUnknown() {
			t.Errorf("the write bounded by the stream: %v, want Unavailable with outcome_unknown (the leader stepped down)", long.Err())
		}
		if took := time.Since(start); took >= 5*time.Second {
			t.Errorf("the request took %v, the stream's whole deadline", took)
		}
	})
}
