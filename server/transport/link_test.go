package transport

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	spb "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/server/servertest/testcerts"
)

// handLink is a link written by hand, as a peer (or an attacker) could: the hello both ways, then frames.
type handLink struct {
	t    *testing.T
	conn net.Conn
	fr   *frameReader
}

func dialHandLink(t *testing.T, addr string) *handLink {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(linkHello)); err != nil {
		t.Fatal(err)
	}
	head := make([]byte, len(linkHello))
	if _, err := io.ReadFull(c, head); err != nil || string(head) != linkHello {
		t.Fatalf("hello answered with %q, %v", head, err)
	}
	return &handLink{t: t, conn: c, fr: &frameReader{r: bufio.NewReader(c), limit: 1 << 20}}
}

func (h *handLink) write(frame []byte) {
	h.t.Helper()
	if _, err := h.conn.Write(frame); err != nil {
		h.t.Fatal(err)
	}
}

func (h *handLink) batch(b *wirepb.RaftBatch) {
	h.t.Helper()
	raw, err := proto.Marshal(b)
	if err != nil {
		h.t.Fatal(err)
	}
	h.write(appendFrame(nil, frameBatch, raw))
}

// end reads until the receiver's end frame and returns its status (OK if the link closed without one).
func (h *handLink) end() error {
	h.t.Helper()
	for {
		kind, payload, err := h.fr.next()
		if err != nil {
			return nil
		}
		if kind == frameEnd {
			st := &spb.Status{}
			if err := proto.Unmarshal(payload, st); err != nil {
				h.t.Fatal(err)
			}
			return status.ErrorProto(st)
		}
	}
}

// serveEach listens on loopback and runs handle on its own goroutine for every connection (and closes
// the connection after), until the test ends; it returns the address.
func serveEach(t *testing.T, handle func(net.Conn)) string {
	lis := listen(t, "127.0.0.1:0")
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = lis.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				handle(c)
			})
		}
	})
	return lis.Addr().String()
}

// answerHello plays a receiver's part of a link's opening; false if the sender did not say hello.
func answerHello(c net.Conn) bool {
	head := make([]byte, len(linkHello))
	if _, err := io.ReadFull(c, head); err != nil || string(head) != linkHello {
		return false
	}
	_, err := c.Write([]byte(linkHello))
	return err == nil
}

// The receiving side checks every batch on a link before raft sees it, and ends a bad link with a
// status that says why.
func TestLinkRejectsBadBatches(t *testing.T) {
	b := startNode(t, 2, func(c *Config) { c.MaxMsgBytes = 4 << 10 })
	encode := func(m *raftpb.Message) []byte {
		raw, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	good := encode(msg(raftpb.MsgHeartbeat, 1, 2, 7))
	batch := func(cluster, from, to uint64, msgs ...[]byte) []byte {
		raw, err := proto.Marshal(&wirepb.RaftBatch{ClusterId: cluster, From: from, To: to, Messages: msgs})
		if err != nil {
			t.Fatal(err)
		}
		return appendFrame(nil, frameBatch, raw)
	}
	for _, tc := range []struct {
		name  string
		frame []byte
		code  codes.Code
	}{
		{"wrong cluster", batch(0xBAD, 1, 2, good), codes.FailedPrecondition},
		{"wrong recipient", batch(0xC1, 1, 3, good), codes.FailedPrecondition},
		{"undecodable message", batch(0xC1, 1, 2, []byte{0xff, 0xff, 0xff}), codes.InvalidArgument},
		{"inconsistent sender", batch(0xC1, 3, 2, good), codes.InvalidArgument},
		{"undecodable batch", appendFrame(nil, frameBatch, []byte{0xff, 0xff}), codes.InvalidArgument},
		{"unknown frame", appendFrame(nil, 9, nil), codes.InvalidArgument},
		{"frame too large", appendFrame(nil, frameBatch, make([]byte, 8<<10)), codes.ResourceExhausted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := dialHandLink(t, b.addr)
			h.write(batch(0xC1, 1, 2, good))
			h.write(tc.frame)
			if err := h.end(); status.Code(err) != tc.code {
				t.Fatalf("link ended with %v, want %v", err, tc.code)
			}
		})
	}
	// The good batch ahead of each bad one was delivered; nothing of the bad ones.
	waitFor(t, "the good batches", func() bool { return len(b.raft.from(1)) == 7 })
	for _, m := range b.raft.from(1) {
		if m.GetIndex() != 7 {
			t.Fatalf("raft processed %v, want only the good message", m)
		}
	}
}

// A sender whose link ends without a bye (its process died) is reported through OnStreamLost; one that
// closes its link (RemovePeer, Close) is not.
func TestLinkLostOnlyWithoutBye(t *testing.T) {
	var lost sync.Map // peer → count
	b := startNode(t, 2, func(c *Config) {
		c.OnStreamLost = func(peer uint64) {
			n, _ := lost.LoadOrStore(peer, new(atomic.Int32))
			n.(*atomic.Int32).Add(1)
		}
	})
	count := func(peer uint64) int32 {
		if n, ok := lost.Load(peer); ok {
			return n.(*atomic.Int32).Load()
		}
		return 0
	}

	a := startNode(t, 1, nil)
	a.tr.AddPeer(2, b.addr)
	a.tr.Send([]*raftpb.Message{msg(raftpb.MsgHeartbeat, 1, 2, 1)})
	waitFor(t, "a's heartbeat", func() bool { return len(b.raft.from(1)) == 1 })
	a.tr.RemovePeer(2) // says bye

	h := dialHandLink(t, b.addr)
	h.batch(batchOf(t, 3, 2, msg(raftpb.MsgHeartbeat, 3, 2, 1)))
	waitFor(t, "3's heartbeat", func() bool { return len(b.raft.from(3)) == 1 })
	_ = h.conn.Close() // no bye
	waitFor(t, "3's link reported lost", func() bool { return count(3) == 1 })
	if n := count(1); n != 0 {
		t.Fatalf("a link closed with a bye was reported lost %d times", n)
	}
}

// A receiver that stops answering pings loses the link within two KeepAliveTimes; the sender reconnects.
func TestKeepaliveEndsASilentLink(t *testing.T) {
	var accepted atomic.Int32
	lis := serveEach(t, func(c net.Conn) {
		accepted.Add(1)
		if answerHello(c) {
			_, _ = io.Copy(io.Discard, c) // reads everything, answers nothing
		}
	})
	a := startNode(t, 1, func(c *Config) { c.KeepAliveTime, c.KeepAliveTimeout = 20*time.Millisecond, 20*time.Millisecond })
	a.tr.AddPeer(2, lis)
	waitFor(t, "a second link after the first went silent", func() bool {
		a.tr.Send([]*raftpb.Message{msg(raftpb.MsgHeartbeat, 1, 2, 1)})
		return accepted.Load() >= 2 && a.tr.Stats().Reconnects >= 1
	})
}

// Messages to one peer arrive in the order Send got them, a burst included.
func TestSendKeepsOrder(t *testing.T) {
	b := startNode(t, 2, nil)
	a := startNode(t, 1, nil)
	a.tr.AddPeer(2, b.addr)
	const n = 2000
	for i := uint64(1); i <= n; i++ {
		a.tr.Send([]*raftpb.Message{msg(raftpb.MsgHeartbeat, 1, 2, i)})
	}
	waitFor(t, "the burst", func() bool { return b.raft.count() == n && a.tr.Stats().Sent+a.tr.Stats().Dropped == n })
	for i, m := range b.raft.from(1) {
		if m.GetIndex() != uint64(i+1) {
			t.Fatalf("message %d has index %d", i, m.GetIndex())
		}
	}
	if s := a.tr.Stats(); s.Sent != n || s.Dropped != 0 {
		t.Fatalf("stats %+v, want %d sent", s, n)
	}
}

// Links dial through the HTTP CONNECT proxy the environment names, as gRPC does, so a proxy sees (and a
// test's fault proxy can cut) every peer connection.
func TestLinkDialsThroughProxy(t *testing.T) {
	b := startNode(t, 2, nil)
	var targets sync.Map
	proxy := serveEach(t, func(c net.Conn) { connectProxy(c, b.addr, &targets) })
	a := startNode(t, 1, nil)
	a.tr.proxy = func(*http.Request) (*url.URL, error) { return &url.URL{Host: proxy}, nil }
	a.tr.AddPeer(2, "n2.proxied.test:1") // resolvable only by the proxy
	waitFor(t, "a message through the proxy", func() bool {
		a.tr.Send([]*raftpb.Message{msg(raftpb.MsgHeartbeat, 1, 2, 1)})
		return b.raft.count() > 0
	})
	if _, ok := targets.Load("n2.proxied.test:1"); !ok {
		t.Fatal("the proxy saw no CONNECT to the peer's address")
	}
}

// connectProxy answers one CONNECT on c by connecting to addr, whatever the target, and copying bytes.
func connectProxy(c net.Conn, addr string, targets *sync.Map) {
	defer c.Close()
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil || req.Method != http.MethodConnect {
		return
	}
	targets.Store(req.Host, true)
	up, err := net.Dial("tcp", addr)
	if err != nil {
		return
	}
	defer up.Close()
	if _, err := c.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(up, br)
		close(done)
	}()
	_, _ = io.Copy(c, up)
	_ = c.Close()
	_ = up.Close()
	<-done
}

// Through the shared port with TLS, gRPC calls still see the caller's member certificate.
func TestTLSForwardSharesThePort(t *testing.T) {
	ca := testcerts.NewCA(t, "ca")
	var caller atomic.Uint64
	leader := startNode(t, 2, func(c *Config) {
		c.TLS, c.MemberID = testcerts.MutualConfig(ca.Node(t, "n2"), ca), members
		c.Forward = func(ctx context.Context, req *wirepb.ForwardRequest) (*wirepb.ForwardResponse, error) {
			caller.Store(req.GetFrom())
			return &wirepb.ForwardResponse{}, nil
		}
	})
	f := tlsNode(t, 1, ca, ca.Node(t, "n1"), nil)
	connect(f, leader)
	f.tr.Send([]*raftpb.Message{msg(raftpb.MsgHeartbeat, 1, 2, 1)})
	waitFor(t, "the heartbeat on the link", func() bool { return len(leader.raft.from(1)) == 1 })
	client, _ := f.tr.PeerClient(2)
	if _, err := client.Forward(context.Background(), &wirepb.ForwardRequest{ClusterId: 0xC1, From: 1}); err != nil {
		t.Fatalf("Forward over TLS on the shared port: %v", err)
	}
	// A client whose certificate names no member is refused at the handshake, gRPC or link.
	conn, err := grpc.NewClient(leader.addr, grpc.WithTransportCredentials(credentials.NewTLS(
		testcerts.MutualConfig(ca.Node(t, "intruder"), ca))))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := wirepb.NewRaftClient(conn).Forward(context.Background(), &wirepb.ForwardRequest{ClusterId: 0xC1}); err == nil {
		t.Fatal("a non-member's Forward was served")
	}
	intruder := testcerts.MutualConfig(ca.Node(t, "intruder"), ca)
	intruder.NextProtos = []string{linkALPN}
	if c, err := tls.Dial("tcp", leader.addr, intruder); err == nil {
		_, err = c.Read(make([]byte, 1)) // TLS 1.3 reports the refusal on the first read
		_ = c.Close()
		if err == nil {
			t.Fatal("a non-member's link handshake succeeded")
		}
	}
	if got := caller.Load(); got != 1 {
		t.Fatalf("Forward served for %d, want 1", got)
	}
}

// A Listener asked for after Close accepts nothing and starts nothing.
func TestListenerAfterClose(t *testing.T) {
	tr := newTransport(t, testConfig(t, 1, newFakeRaft()))
	_ = tr.Close()
	l := tr.Listener(listen(t, "127.0.0.1:0"))
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
	}
}

// A peer that stops reading: Send only queues, so it never waits on the full socket (which would stall
// the node's Ready loop); removing the peer ends the peer goroutine's blocked write.
func TestSendDoesNotWaitForAPeerThatDoesNotRead(t *testing.T) {
	release := make(chan struct{})
	lis := serveEach(t, func(c net.Conn) {
		if answerHello(c) {
			<-release // reads nothing more
		}
	})
	t.Cleanup(func() { close(release) }) // registered after serveEach's, so it runs first
	// Keepalive slower than the test, so only RemovePeer can end the blocked write below.
	a := startNode(t, 1, func(c *Config) { c.QueueSize, c.KeepAliveTime = 1<<14, time.Minute })
	a.tr.AddPeer(2, lis)
	payload := make([]byte, 3<<10)
	a.tr.Send([]*raftpb.Message{msgApp(1, 2, 1, payload)})
	waitFor(t, "the link", func() bool { return a.tr.Stats().Sent == 1 })
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		for i := range uint64(4000) { // 12 MB: more than the socket's buffers hold
			a.tr.Send([]*raftpb.Message{msgApp(1, 2, i+2, payload)})
		}
	}()
	waitFor(t, "Send to return on a peer that does not read", func() bool { return isClosed(sent) })
	if s := a.tr.Stats(); s.SendFailures != 0 || s.Dropped != 0 {
		t.Fatalf("stats %+v: want queued messages, no failure", s)
	}
	// The peer goroutine is blocked writing to the full socket; removing the peer ends that write.
	removed := make(chan struct{})
	go func() { a.tr.RemovePeer(2); close(removed) }()
	waitFor(t, "RemovePeer to return", func() bool { return isClosed(removed) })
}
