package transport

import (
	"bytes"
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/server/servertest/loopback"
)

func TestConfigValidate(t *testing.T) {
	r := newFakeRaft()
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"defaults", Config{LocalID: 1, Raft: r}, true},
		{"no local id", Config{Raft: r}, false},
		{"no raft", Config{LocalID: 1}, false},
		{"negative queue", Config{LocalID: 1, Raft: r, QueueSize: -1}, false},
		{"backoff inverted", Config{LocalID: 1, Raft: r, BackoffMin: time.Second, BackoffMax: time.Millisecond}, false},
		{"tiny messages", Config{LocalID: 1, Raft: r, MaxMsgBytes: 10}, false},
		{"negative keepalive", Config{LocalID: 1, Raft: r, KeepAliveTime: -time.Second}, false},
		{"negative keepalive timeout", Config{LocalID: 1, Raft: r, KeepAliveTimeout: -time.Second}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.cfg.Validate(); (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
	if _, err := New(Config{}); err == nil {
		t.Fatal("New accepted an empty config")
	}
}

func TestBackoffDelay(t *testing.T) {
	lo, hi := 10*time.Millisecond, 300*time.Millisecond
	for failures, want := range map[int]time.Duration{
		1: 10 * time.Millisecond, 2: 20 * time.Millisecond, 3: 40 * time.Millisecond,
		6: hi, 100: hi,
	} {
		for range 100 {
			d := backoffDelay(lo, hi, failures)
			if d < want/2 || d > want {
				t.Fatalf("backoffDelay(%d) = %v, want within [%v, %v]", failures, d, want/2, want)
			}
		}
	}
}

// Three nodes send to each other concurrently; every receiver sees each sender's messages complete and
// in order.
func TestPerPeerOrderAcrossThreeNodes(t *testing.T) {
	const n = 3000
	big := func(c *Config) { c.QueueSize = n } // no drops: this test is about order
	nodes := []*node{startNode(t, 1, big), startNode(t, 2, big), startNode(t, 3, big)}
	connect(nodes...)

	done := make(chan struct{})
	for _, a := range nodes {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := uint64(1); i <= n; i += 100 {
				var msgs []*raftpb.Message
				for j := i; j < i+100; j++ {
					for _, b := range nodes {
						if b != a {
							msgs = append(msgs, msg(raftpb.MsgHeartbeat, a.id, b.id, j))
						}
					}
				}
				a.tr.Send(msgs)
			}
		}()
	}
	for range nodes {
		<-done
	}
	for _, b := range nodes {
		waitFor(t, "all messages to arrive", func() bool { return b.raft.count() == n*(len(nodes)-1) })
		for _, a := range nodes {
			if a == b {
				continue
			}
			got := b.raft.from(a.id)
			for i, m := range got {
				if m.GetIndex() != uint64(i+1) || m.GetTo() != b.id {
					t.Fatalf("node %d: message %d from %d has index %d to %d", b.id, i, a.id, m.GetIndex(), m.GetTo())
				}
			}
		}
	}
	for _, a := range nodes {
		waitFor(t, "the sender's count", func() bool { return a.tr.Stats().Sent >= 2*n })
		if s := a.tr.Stats(); s.Sent != 2*n || s.Dropped != 0 {
			t.Fatalf("node %d stats %+v, want %d sent and none dropped", a.id, s, 2*n)
		}
	}
}

// While the receiver is slow, queued messages leave in batches, within MaxBatchMessages.
func TestBatching(t *testing.T) {
	const n, maxBatch = 2000, 100
	b := startNode(t, 2, nil)
	b.raft.gate = make(chan struct{})
	a := startNode(t, 1, func(c *Config) { c.QueueSize = n; c.MaxBatchMessages = maxBatch })
	connect(a, b)

	payload := bytes.Repeat([]byte("x"), 1024)
	var msgs []*raftpb.Message
	for i := range uint64(n) {
		msgs = append(msgs, msgApp(1, 2, i+1, payload))
	}
	a.tr.Send(msgs)
	close(b.raft.gate)
	// Sent counts a batch after its write returns, which can be after the receiver has it.
	waitFor(t, "all messages to arrive", func() bool { return b.raft.count() == n && a.tr.Stats().Sent == n })

	for i, m := range b.raft.from(1) {
		if m.GetIndex() != uint64(i+1) || !bytes.Equal(m.GetEntries()[0].GetData(), payload) {
			t.Fatalf("message %d arrived as index %d with %d bytes", i, m.GetIndex(), len(m.GetEntries()[0].GetData()))
		}
	}
	s := a.tr.Stats()
	if s.Sent != n || s.Batches > n/4 || s.Batches < n/maxBatch {
		t.Fatalf("sent %d messages in %d batches, want %d in [%d, %d]", s.Sent, s.Batches, n, n/maxBatch, n/4)
	}
	t.Logf("%d messages in %d batches", s.Sent, s.Batches)
}

// A dead peer never slows Send down: the queue fills, the rest is dropped and reported.
func TestSendNeverBlocksOnDeadPeer(t *testing.T) {
	const n = 100_000
	r := newFakeRaft()
	tr := newTransport(t, testConfig(t, 1, r))
	tr.AddPeer(2, deadAddr(t))

	msgs := make([]*raftpb.Message, n)
	for i := range msgs {
		msgs[i] = msg(raftpb.MsgApp, 1, 2, uint64(i))
	}
	// Send must return with the peer still dead: a Send that waited for room in the full queue would wait
	// forever. The deadline only bounds the test; how fast Send is belongs to the benchmarks.
	start := time.Now()
	sent := make(chan struct{})
	go func() { tr.Send(msgs); close(sent) }()
	select {
	case <-sent:
	case <-time.After(30 * time.Second):
		t.Fatalf("Send of %d messages to a dead peer has not returned after 30 s", n)
	}
	t.Logf("Send of %d messages to a dead peer took %v", n, time.Since(start))
	waitFor(t, "every message to be dropped", func() bool { return tr.Stats().Dropped == n })
	waitFor(t, "ReportUnreachable", func() bool { return r.unreachableCount(2) > 0 })
	if s := tr.Stats(); s.Sent != 0 || s.SendFailures == 0 {
		t.Fatalf("stats %+v, want nothing sent and some failures", s)
	}
}

// A peer that starts after the sender gets traffic once the sender reconnects.
func TestPeerComesUpLater(t *testing.T) {
	dead := loopback.ReservePort(t)
	a := startNode(t, 1, nil)
	a.tr.AddPeer(2, dead.Addr)
	a.tr.Send([]*raftpb.Message{msg(raftpb.MsgHeartbeat, 1, 2, 1)})
	waitFor(t, "the down peer to be reported", func() bool { return a.raft.unreachableCount(2) > 0 })

	rb := newFakeRaft()
	trb := newTransport(t, testConfig(t, 2, rb))
	serve(t, trb, dead.Listen(t))
	// Raft keeps sending heartbeats; so does the test until one gets through.
	waitFor(t, "traffic after reconnect", func() bool {
		a.tr.Send([]*raftpb.Message{msg(raftpb.MsgHeartbeat, 1, 2, 2)})
		return rb.count() > 0
	})
}

// A peer that comes back and reaches us ends our backoff to it: with a backoff far longer than the test,
// traffic flows as soon as the returning peer's own stream arrives. A restarted follower used to stay
// cut off from the others for up to BackoffMax, delaying an election by seconds.
func TestPeerThatReachesUsEndsOurBackoff(t *testing.T) {
	dead := loopback.ReservePort(t)
	a := startNode(t, 1, func(c *Config) {
		c.BackoffMin, c.BackoffMax = time.Hour, time.Hour
		// gRPC's connection backoff stays short: this test is about the transport's own.
		c.DialOptions = []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{
			BaseDelay: 2 * time.Millisecond, Multiplier: 1.6, MaxDelay: 20 * time.Millisecond}})}
	})
	a.tr.AddPeer(2, dead.Addr)
	a.tr.Send([]*raftpb.Message{msg(raftpb.MsgHeartbeat, 1, 2, 1)})
	waitFor(t, "the down peer to be reported", func() bool { return a.raft.unreachableCount(2) > 0 })

	rb := newFakeRaft()
	trb := newTransport(t, testConfig(t, 2, rb))
	serve(t, trb, dead.Listen(t))
	trb.AddPeer(1, a.addr)
	waitFor(t, "traffic to the returned peer", func() bool {
		trb.Send([]*raftpb.Message{msg(raftpb.MsgHeartbeat, 2, 1, 2)})
		a.tr.Send([]*raftpb.Message{msg(raftpb.MsgHeartbeatResp, 1, 2, 2)})
		return rb.count() > 0
	})
}

// A peer that restarts on the same address gets traffic again over a new stream.
func TestReconnectAfterPeerRestart(t *testing.T) {
	a := startNode(t, 1, nil)
	b := startNode(t, 2, nil)
	connect(a, b)
	waitFor(t, "first traffic", func() bool {
		a.tr.Send([]*raftpb.Message{msg(raftpb.MsgHeartbeat, 1, 2, 1)})
		return b.raft.count() > 0
	})

	b.restart(t)
	waitFor(t, "traffic after restart", func() bool {
		a.tr.Send([]*raftpb.Message{msg(raftpb.MsgHeartbeat, 1, 2, 2)})
		return b.raft.count() > 0
	})
	if s := a.tr.Stats(); s.Reconnects == 0 {
		t.Fatalf("stats %+v, want a reconnect", s)
	}
}

// A node of another cluster refuses the stream; nothing reaches its raft and the sender reports the
// peer unreachable.
func TestWrongClusterRejected(t *testing.T) {
	a := startNode(t, 1, nil)
	b := startNode(t, 2, func(c *Config) { c.ClusterID = 0xC2 })
	a.tr.AddPeer(2, b.addr)
	waitFor(t, "the stream to be rejected", func() bool {
		a.tr.Send([]*raftpb.Message{msg(raftpb.MsgHeartbeat, 1, 2, 1)})
		return b.tr.Stats().Rejected > 0 && a.tr.Stats().SendFailures > 0
	})
	waitFor(t, "ReportUnreachable", func() bool { return a.raft.unreachableCount(2) > 0 })
	if got := b.raft.count(); got != 0 {
		t.Fatalf("other cluster's raft processed %d messages", got)
	}
}

// A message raft refuses is dropped, not the link.
func TestProcessErrorKeepsLink(t *testing.T) {
	b := startNode(t, 2, nil)
	b.raft.refuse = func(m *raftpb.Message) bool { return m.GetIndex()%2 == 0 }
	a := startNode(t, 1, nil)
	connect(a, b)
	var msgs []*raftpb.Message
	for i := range uint64(10) {
		msgs = append(msgs, msg(raftpb.MsgHeartbeat, 1, 2, i+1))
	}
	a.tr.Send(msgs)
	// The last message is refused, so "five accepted" can hold before it arrives: wait for all ten.
	waitFor(t, "all ten messages", func() bool {
		s := b.tr.Stats()
		return b.raft.count() == 5 && s.Received == 10 && s.ProcessErrors == 5
	})
	if s := b.tr.Stats(); s.ProcessErrors != 5 || s.Received != 10 || s.Rejected != 0 {
		t.Fatalf("receiver stats %+v", s)
	}
	if s := a.tr.Stats(); s.SendFailures != 0 {
		t.Fatalf("sender stats %+v, want no failures", s)
	}
}

// Every MsgSnap gets exactly one report: Finish when written, Failure when dropped for any reason.
func TestSnapshotReports(t *testing.T) {
	b := startNode(t, 2, nil)
	a := startNode(t, 1, func(c *Config) {
		c.MaxMsgBytes = 1 << 20
		c.Filter = func(m *raftpb.Message) bool { return m.GetTo() != 4 }
	})
	a.tr.AddPeer(2, b.addr)
	a.tr.AddPeer(3, deadAddr(t))

	data := bytes.Repeat([]byte("s"), 64<<10)
	a.tr.Send([]*raftpb.Message{
		msgSnap(1, 2, data),                // delivered
		msgSnap(1, 3, data),                // peer down
		msgSnap(1, 4, data),                // filtered
		msgSnap(1, 5, data),                // unknown peer
		msgSnap(1, 2, make([]byte, 2<<20)), // too large for MaxMsgBytes
	})
	waitFor(t, "five snapshot reports", func() bool { return len(a.raft.snapshotReports()) == 5 })
	reps := a.raft.snapshotReports()
	for _, want := range []struct {
		to     uint64
		status raft.SnapshotStatus
	}{{2, raft.SnapshotFinish}, {2, raft.SnapshotFailure}, {3, raft.SnapshotFailure}, {4, raft.SnapshotFailure}, {5, raft.SnapshotFailure}} {
		if countStatus(reps, want.to, want.status) != 1 {
			t.Fatalf("reports %+v: want exactly one %v for %d", reps, want.status, want.to)
		}
	}
	waitFor(t, "the snapshot to arrive", func() bool { return b.raft.count() == 1 })
	if got := b.raft.from(1)[0].GetSnapshot().GetData(); !bytes.Equal(got, data) {
		t.Fatalf("snapshot arrived with %d bytes, want %d", len(got), len(data))
	}
	if a.raft.unreachableCount(5) == 0 {
		t.Fatal("unknown peer not reported unreachable")
	}
}

// Config.Filter cuts a link both ways when both ends filter, and heals it when it lets traffic through.
func TestFilterCutsLinks(t *testing.T) {
	var cut atomic.Bool
	cutLink := func(c *Config) {
		id := c.LocalID
		c.Filter = func(m *raftpb.Message) bool {
			return !cut.Load() || !(id == 1 && m.GetTo() == 2 || id == 2 && m.GetTo() == 1)
		}
	}
	n1, n2, n3 := startNode(t, 1, cutLink), startNode(t, 2, cutLink), startNode(t, 3, cutLink)
	connect(n1, n2, n3)

	cut.Store(true)
	for i := range uint64(50) {
		n1.tr.Send([]*raftpb.Message{msg(raftpb.MsgHeartbeat, 1, 2, i), msg(raftpb.MsgHeartbeat, 1, 3, i)})
		n2.tr.Send([]*raftpb.Message{msg(raftpb.MsgHeartbeat, 2, 1, i), msg(raftpb.MsgHeartbeat, 2, 3, i)})
	}
	// Sent counts a batch after its write returns, which can be after the receiver has it.
	waitFor(t, "uncut traffic", func() bool { return n3.raft.count() == 100 && n1.tr.Stats().Sent == 50 })
	if got := len(n2.raft.from(1)) + len(n1.raft.from(2)); got != 0 {
		t.Fatalf("%d messages crossed the cut link", got)
	}
	if s := n1.tr.Stats(); s.Filtered != 50 || s.Sent != 50 {
		t.Fatalf("node 1 stats %+v, want 50 filtered and 50 sent", s)
	}

	cut.Store(false)
	n1.tr.Send([]*raftpb.Message{msg(raftpb.MsgHeartbeat, 1, 2, 100)})
	waitFor(t, "traffic over the healed link", func() bool { return len(n2.raft.from(1)) == 1 })
}

// UpdatePeer moves traffic to the new address; RemovePeer stops it and reports the peer unreachable.
func TestUpdateAndRemovePeer(t *testing.T) {
	a := startNode(t, 1, nil)
	old := startNode(t, 2, nil)
	moved := startNode(t, 2, nil)
	a.tr.AddPeer(2, old.addr)
	a.tr.Send([]*raftpb.Message{msg(raftpb.MsgHeartbeat, 1, 2, 1)})
	waitFor(t, "traffic to the old address", func() bool { return old.raft.count() == 1 })

	a.tr.UpdatePeer(2, moved.addr)
	a.tr.UpdatePeer(9, moved.addr) // unknown: ignored
	a.tr.Send([]*raftpb.Message{msg(raftpb.MsgHeartbeat, 1, 2, 2)})
	waitFor(t, "traffic to the new address", func() bool { return moved.raft.count() == 1 })
	if _, ok := a.tr.PeerClient(9); ok {
		t.Fatal("UpdatePeer added an unknown peer")
	}

	a.tr.RemovePeer(2)
	if _, ok := a.tr.PeerClient(2); ok {
		t.Fatal("PeerClient found a removed peer")
	}
	a.tr.Send([]*raftpb.Message{msg(raftpb.MsgHeartbeat, 1, 2, 3)})
	waitFor(t, "ReportUnreachable for the removed peer", func() bool { return a.raft.unreachableCount(2) > 0 })
	if old.raft.count()+moved.raft.count() != 2 {
		t.Fatal("a removed peer still got traffic")
	}
	a.tr.AddPeer(1, old.addr) // the local id: ignored
	if _, ok := a.tr.PeerClient(1); ok {
		t.Fatal("AddPeer accepted the local id")
	}
}

// The server can call Forward on a peer over the transport's connection.
func TestForwardOverPeerClient(t *testing.T) {
	leader := startNode(t, 2, func(c *Config) {
		c.Forward = func(_ context.Context, req *wirepb.ForwardRequest) (*wirepb.ForwardResponse, error) {
			if req.GetFrom() != 1 {
				return nil, status.Error(codes.InvalidArgument, "unexpected sender")
			}
			return &wirepb.ForwardResponse{}, nil
		}
	})
	plain := startNode(t, 3, nil)
	f := startNode(t, 1, nil)
	connect(f, leader, plain)

	client, ok := f.tr.PeerClient(2)
	if !ok {
		t.Fatal("no client for peer 2")
	}
	ctx := context.Background()
	if _, err := client.Forward(ctx, &wirepb.ForwardRequest{ClusterId: 0xC1, From: 1}); err != nil {
		t.Fatalf("Forward: %v", err)
	}
	if _, err := client.Forward(ctx, &wirepb.ForwardRequest{ClusterId: 0xBAD, From: 1}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Forward from another cluster: %v, want FailedPrecondition", err)
	}
	client3, _ := f.tr.PeerClient(3)
	if _, err := client3.Forward(ctx, &wirepb.ForwardRequest{ClusterId: 0xC1, From: 1}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("Forward without a handler: %v, want Unimplemented", err)
	}
}

// Close ends inbound links even while the peer keeps its link open, so the gRPC server can stop
// gracefully; afterwards Send drops quietly and Close can be called again.
func TestCloseEndsInboundLinks(t *testing.T) {
	a := startNode(t, 1, nil)
	b := startNode(t, 2, nil)
	connect(a, b)
	a.tr.Send([]*raftpb.Message{msg(raftpb.MsgHeartbeat, 1, 2, 1)})
	waitFor(t, "an open link", func() bool { return b.raft.count() == 1 })

	if err := b.tr.Close(); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan struct{})
	go func() {
		b.srv.s.GracefulStop()
		close(stopped)
	}()
	waitFor(t, "graceful stop", func() bool { return isClosed(stopped) })
	b.tr.Send([]*raftpb.Message{msg(raftpb.MsgHeartbeat, 2, 1, 1)})
	if err := b.tr.Close(); err != nil {
		t.Fatal(err)
	}
	if s := b.tr.Stats(); s.Dropped != 1 {
		t.Fatalf("stats after close %+v, want the late message dropped", s)
	}
}

// After things settle, every message handed to Send is accounted for exactly once.
func TestStatsAccounting(t *testing.T) {
	a := startNode(t, 1, func(c *Config) {
		c.QueueSize = 10
		c.Filter = func(m *raftpb.Message) bool { return m.GetIndex()%10 != 0 }
	})
	b := startNode(t, 2, nil)
	b.raft.gate = make(chan struct{})
	connect(a, b)
	a.tr.AddPeer(3, deadAddr(t))
	total := 0
	for i := range uint64(300) {
		a.tr.Send([]*raftpb.Message{msg(raftpb.MsgApp, 1, 2, i), msg(raftpb.MsgApp, 1, 3, i), msg(raftpb.MsgApp, 1, 4, i)})
		total += 3
	}
	close(b.raft.gate)
	waitFor(t, "settled counters", func() bool {
		s := a.tr.Stats()
		return s.Sent+s.Dropped+s.Filtered == uint64(total) && uint64(b.raft.count()) == s.Sent
	})
}

// A receiver answers the messages of a lightly loaded link with nothing: no acknowledgement, window
// update or ping per message, which would cost each node more writes (and the peer wake-ups) per raft
// message.
func TestReceiverWritesNothingBackPerMessage(t *testing.T) {
	const n = 200
	b := &node{id: 2, raft: newFakeRaft()}
	b.tr = newTransport(t, testConfig(t, 2, b.raft))
	lis := &countingListener{Listener: listen(t, "127.0.0.1:0")}
	b.addr = lis.Addr().String()
	b.srv = serve(t, b.tr, lis)
	a := startNode(t, 1, nil)
	a.tr.AddPeer(2, b.addr)

	// One message at a time, each delivered before the next is sent: the estimator's case, a sender
	// that never has a second message queued.
	a.tr.Send([]*raftpb.Message{msgApp(1, 2, 1, []byte("x"))})
	waitFor(t, "the first message", func() bool { return b.raft.count() == 1 })
	before := lis.writes.Load()
	for i := range uint64(n) {
		a.tr.Send([]*raftpb.Message{msgApp(1, 2, i+2, []byte("x"))})
		waitFor(t, "the message", func() bool { return b.raft.count() == int(i)+2 })
	}
	if w := lis.writes.Load() - before; w > n/10 {
		t.Fatalf("the receiver wrote %d times to the sender while receiving %d messages, want at most %d", w, n, n/10)
	}
}

// countingListener counts the writes to the connections it accepted.
type countingListener struct {
	net.Listener
	writes atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, writes: &l.writes}, nil
}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}
