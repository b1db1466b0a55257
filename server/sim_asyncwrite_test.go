package server

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leased/leased/api/leasepb"
)

// TestSimLeaderWritesWhileItReplicates: the leader sends a new entry to its followers while it writes
// the entry itself (raft's asynchronous storage writes), yet counts only durable copies toward its
// commit (decision 8). The leader's write of the entry stalls for 2 s, one follower's for 1 s, the other
// follower's disk is fine. While the leader's write stalls, the healthy follower makes the entry durable
// and the stalled one does not; once the stalled follower's write returns it has the entry too, while the
// leader's write is still stalled. The client is answered only after the leader's write returned and the
// entry applied there, and no node applies the entry before the leader's write returned: raft runs on
// the leader's Ready loop (internal/raftnode/host.go), which steps its followers' acknowledgements, and its own, only
// once its write is done, so the commit counts only durable copies.
//
// With the leader persisting before it sends (the loop before asynchronous writes), the healthy follower
// does not get the entry until the leader's write returns, and the test fails in its first wait. (Under
// raft.Node, raft's own goroutine stepped acknowledgements while the loop wrote, and this test also
// watched the leader's commit during the stall; with raft on the loop there is nothing to watch: the
// commit can move only after the write, whichever order LocalStorage.Append steps the responses in.)
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
		durable := func(i int) uint64 {
			last, err := c.logs[i].LastIndex()
			if err != nil {
				t.Fatal(err)
			}
			return last
		}
		appliedAnywhere := func() bool {
			for i := range c.size() {
				if c.node(i).state.Applied() >= next {
					return true
				}
			}
			return false
		}

		c.waitFor(followerStall/2, "durable copy of the entry on the follower whose disk is fine", func() bool {
			return durable(fine) >= next
		})
		synctest.Wait() // everything that can happen before a stalled write returns has happened
		if durable(slow) >= next || durable(l) >= next {
			t.Fatalf("durable before the stalled writes of %d returned: stalled follower %d, leader %d", next, durable(slow), durable(l))
		}
		if appliedAnywhere() {
			t.Fatalf("entry %d applied with one durable copy of three: a write in flight was counted", next)
		}
		select {
		case a := <-answered:
			t.Fatalf("the client was answered before the entry committed: %v, %v", a.resp, a.err)
		default:
		}

		c.waitFor(leaderStall, "durable copy on the stalled follower", func() bool { return durable(slow) >= next })
		if _, _, writing := leader.raft.Watchdog().InFlight(); !writing || time.Since(start) >= leaderStall {
			t.Fatalf("both followers had the entry %v after the stalls began, the leader's write in flight: %v; want it during the leader's %v stall",
				time.Since(start), writing, leaderStall)
		}
		synctest.Wait()
		if appliedAnywhere() {
			t.Fatalf("entry %d applied before the leader's own write of it returned", next)
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
			if tok < next || leader.state.Applied() < tok {
				t.Fatalf("grant with token %d (entry %d), the leader applied %d", tok, next, leader.state.Applied())
			}
		case <-time.After(leaderStall + time.Second):
			t.Fatal("the client was not answered after the leader's write returned")
		}
		c.converge(5 * time.Second)
	})
}

// TestSimFollowersAcknowledgeOnlyDurableCopies: a follower acknowledges an entry only once its write of
// it returned (decision 8). Both followers' writes of a new entry stall for 1 s, the leader's disk is
// fine: the leader has one durable copy of three, so the entry must not apply on it, nor the client be
// answered, before a follower's write returns. With a follower's acknowledgement sent before its write
// (delivering the responses before persist in LocalStorage.Append), the entry applies at once.
func TestSimFollowersAcknowledgeOnlyDurableCopies(t *testing.T) {
	const stall = time.Second
	runSim(t, 3, func(cfg *Config) {
		cfg.ElectionTicks = 250 // 5 s: the followers' stalled loops start no election
		cfg.DiskStallTimeout = 20 * time.Second
		cfg.ProposalTimeout = 10 * time.Second
	}, func(t *testing.T, c *simCluster) {
		l := c.waitLeader(20 * time.Second)
		synctest.Wait()
		last, err := c.logs[l].LastIndex()
		if err != nil {
			t.Fatal(err)
		}
		next := last + 1
		for i := range c.size() {
			if i != l {
				c.logs[i].Stall(stall)
			}
		}
		start := time.Now()
		answered := make(chan time.Time, 1)
		go func() {
			_, err := c.leases(l).Acquire(context.Background(), &leasepb.AcquireRequest{
				Resource: "r", Holder: "h", TtlMs: 60_000, RequestId: "r"})
			if err != nil {
				t.Error(err)
			}
			answered <- time.Now()
		}()
		leader := c.node(l)
		c.waitFor(stall/2, "the leader's durable copy", func() bool {
			last, err := c.logs[l].LastIndex()
			return err == nil && last >= next
		})
		synctest.Wait() // everything that can happen before a follower's write returns has happened
		if got := leader.state.Applied(); got >= next {
			t.Fatalf("the leader applied %d with its own durable copy alone (entry %d)", got, next)
		}
		select {
		case <-answered:
			t.Fatal("the client was answered before a follower's write returned")
		default:
		}
		select {
		case at := <-answered:
			if took := at.Sub(start); took < stall {
				t.Fatalf("answered %v after the stalls began, before the followers' %v writes returned", took, stall)
			}
		case <-time.After(stall + time.Second):
			t.Fatal("the client was not answered after the followers' writes returned")
		}
		c.converge(5 * time.Second)
	})
}

// TestSimAnswerComesAfterTheAppliedIndex: a client that holds a grant never finds the leader's applied
// index below the grant's token (cluster status, metrics and linearizable reads all read that index).
// With the proposer answered inside the apply, before the index was stored, the client's goroutine
// could run first and read the old index.
func TestSimAnswerComesAfterTheAppliedIndex(t *testing.T) {
	runSim(t, 3, nil, func(t *testing.T, c *simCluster) {
		l := c.waitLeader(20 * time.Second)
		for i := range 500 {
			resp, err := c.leases(l).Acquire(context.Background(), &leasepb.AcquireRequest{
				Resource: fmt.Sprintf("r%d", i), Holder: "h", TtlMs: 60_000, RequestId: fmt.Sprintf("q%d", i)})
			if err != nil {
				t.Fatal(err)
			}
			if tok, applied := resp.GetLease().GetToken(), c.node(l).state.Applied(); applied < tok {
				t.Fatalf("acquire %d answered with token %d while the leader's applied index is %d", i, tok, applied)
			}
		}
	})
}
