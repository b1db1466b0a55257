package transport

import (
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

// TestPerPeerHooks: a heartbeat answered by its peer reports the round trip to that peer (once: a
// response matches the oldest unanswered heartbeat), and messages lost to an unreachable peer are
// reported as dropped to it, adding up to Stats.Dropped.
func TestPerPeerHooks(t *testing.T) {
	var (
		mu      sync.Mutex
		rtts    = map[uint64][]time.Duration{}
		dropped = map[uint64]int{}
	)
	a := startNode(t, 1, func(c *Config) {
		c.OnRoundTrip = func(peer uint64, d time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			rtts[peer] = append(rtts[peer], d)
		}
		c.OnDropped = func(peer uint64, n int) {
			mu.Lock()
			defer mu.Unlock()
			dropped[peer] += n
		}
	})
	b := startNode(t, 2, nil)
	connect(a, b)
	a.tr.AddPeer(3, deadAddr(t))

	a.tr.Send([]*raftpb.Message{msg(raftpb.MsgHeartbeat, 1, 2, 0), msg(raftpb.MsgHeartbeat, 1, 2, 0)})
	waitFor(t, "the heartbeats at b", func() bool { return len(b.raft.from(1)) == 2 })
	b.tr.Send([]*raftpb.Message{msg(raftpb.MsgHeartbeatResp, 2, 1, 0), msg(raftpb.MsgHeartbeatResp, 2, 1, 0)})
	waitFor(t, "the responses at a", func() bool { return len(a.raft.from(2)) == 2 })
	mu.Lock()
	got := append([]time.Duration(nil), rtts[2]...)
	mu.Unlock()
	if len(got) != 1 || got[0] <= 0 {
		t.Errorf("round trips to 2 = %v, want one, > 0", got)
	}

	a.tr.Send([]*raftpb.Message{msgApp(1, 3, 1, nil), msgApp(1, 3, 2, nil), msg(raftpb.MsgHeartbeat, 1, 3, 0)})
	waitFor(t, "the messages to 3 dropped", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return dropped[3] == 3
	})
	mu.Lock()
	defer mu.Unlock()
	if total := dropped[2] + dropped[3]; uint64(total) != a.tr.Stats().Dropped {
		t.Errorf("dropped reported %v, Stats.Dropped %d", dropped, a.tr.Stats().Dropped)
	}
	if len(rtts[3]) != 0 {
		t.Errorf("a round trip to the unreachable peer: %v", rtts[3])
	}
}
