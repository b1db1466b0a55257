package server

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leased/leased/api/leasepb"
)

// TestSimLeaderWritesWhileItReplicates: the leader sends a new entry to its followers while it writes
// the entry itself (raft's asynchronous storage writes), yet counts only durable copies toward its
// commit (decision 8). The leader's write of the entry stalls for 2 s, one follower's for 1 s, the other
// follower's disk is fine. While only that follower has the entry durable, it does not commit — one
// copy of three — so the leader did not count its own write in flight, and the stalled follower has not
// acknowledged it. Once the stalled follower's write returns, the entry commits with the two followers
// while the leader's own write is still stalled; the client is answered only after that write returned
// and the entry applied on the leader.
//
// With the leader persisting before it sends (the loop before asynchronous writes), the healthy follower
// does not get the entry until the leader's write returns, and the test fails in its first wait; with the
// leader's acknowledgement stepped before its write, it fails on the commit with one durable copy.
func TestSimLeaderWritesWhileItReplicates(t *testing.T) {
	const leaderStall, followerStall = 2 * time.Second, time.Second
	runSim(t, 3, func(cfg *Config) {
		cfg.ElectionTicks = 250 // 5 s: no election while the leader's loop is stalled in its write
		cfg.DiskStallTimeout = 20 * time.Second
		cfg.ProposalTimeout = 10 * time.Second
	}, func(t *testing.T, c *simCluster) {
		l := c.waitLeader(20 * time.Second)
		slow, fine := (l+1)%c.size(), (l+2)%c.size()
		synctest.Wait() // the cluster is idle: the next Save on each node is the new entry's
		last, err := c.logs[l].LastIndex()
		if err != nil {
			t.Fatal(err)
		}
		next := last + 1 // the entry the stalled writes hold back
		c.logs[l].Stall(leaderStall)
		c.logs[slow].Stall(followerStall)
		start := time.Now()

		type answer struct {
			resp *leasepb.AcquireResponse
			err  error
			at   time.Time
		}
		answered := make(chan answer, 1)
		go func() {
			resp, err := c.leases(l).Acquire(context.Background(), &leasepb.AcquireRequest{
				Resource: "r", Holder: "h", TtlMs: 60_000, RequestId: "r"})
			answered <- answer{resp, err, time.Now()}
		}()

		leader := c.node(l)
		match := func(i int) uint64 { return leader.raft.Status().Progress[c.id(i)].Match }
		commit := func() uint64 { return leader.raft.Status().GetCommit() }
		durable := func(i int) uint64 {
			last, err := c.logs[i].LastIndex()
			if err != nil {
				t.Fatal(err)
			}
			return last
		}

		c.waitFor(followerStall/2, "durable, acknowledged copy of the entry on the follower whose disk is fine", func() bool {
			return durable(fine) >= next && match(fine) >= next
		})
		synctest.Wait() // everything that can happen before a stalled write returns has happened
		if got := match(slow); got >= next || durable(slow) >= next {
			t.Fatalf("the stalled follower acknowledged %d (durable %d) before its write of %d returned", got, durable(slow), next)
		}
		if got := match(l); got >= next {
			t.Fatalf("the leader's own progress reached %d while its write of %d is stalled", got, next)
		}
		if got := commit(); got >= next {
			t.Fatalf("entry %d committed (commit %d) with one durable copy of three: a write in flight was counted", next, got)
		}
		select {
		case a := <-answered:
			t.Fatalf("the client was answered before the entry committed: %v, %v", a.resp, a.err)
		default:
		}

		c.waitFor(leaderStall, "commit with the two followers", func() bool { return commit() >= next })
		if _, _, writing := leader.inFlightWrite(); !writing || time.Since(start) >= leaderStall {
			t.Fatalf("the entry committed %v after the stalls began, the leader's write in flight: %v; want it committed by the followers during the leader's %v stall",
				time.Since(start), writing, leaderStall)
		}
		t.Logf("entry %d committed %v after the stalls began, by the two followers, while the leader's write stalls", next, time.Since(start))
		if got := leader.applied.Load(); got >= next {
			t.Fatalf("the leader applied %d before its own write of %d returned", got, next)
		}

		select {
		case a := <-answered:
			if a.err != nil {
				t.Fatal(a.err)
			}
			tok := a.resp.GetLease().GetToken()
			if took := a.at.Sub(start); took < leaderStall {
				t.Fatalf("the client was answered %v after the stalls began, before the leader's %v write returned", took, leaderStall)
			}
			if tok < next || leader.applied.Load() < tok {
				t.Fatalf("grant with token %d (entry %d), the leader applied %d", tok, next, leader.applied.Load())
			}
		case <-time.After(leaderStall + time.Second):
			t.Fatal("the client was not answered after the leader's write returned")
		}
		c.converge(5 * time.Second)
	})
}
