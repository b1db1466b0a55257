package transport

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"

	"github.com/leased/leased/server/servertest/loopback"
)

// fakeRaft records what the transport hands to raft.
type fakeRaft struct {
	mu          sync.Mutex
	got         map[uint64][]*raftpb.Message // by sender
	n           int
	unreachable map[uint64]int
	snaps       []snapshotReport
	changed     chan struct{} // capacity 1; poked on every change, for waiters that must not sleep

	// gate, if set, blocks Process until it is closed (or the stream ends).
	gate chan struct{}
	// refuse, if set, makes Process return an error for messages it matches.
	refuse func(m *raftpb.Message) bool
	// countOnly skips recording messages (benchmarks).
	countOnly bool
}

func newFakeRaft() *fakeRaft {
	return &fakeRaft{
		got:         make(map[uint64][]*raftpb.Message),
		unreachable: make(map[uint64]int),
		changed:     make(chan struct{}, 1),
	}
}

var errRefused = errors.New("refused")

func (f *fakeRaft) Process(ctx context.Context, m *raftpb.Message) error {
	if f.gate != nil {
		select {
		case <-f.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if f.refuse != nil && f.refuse(m) {
		return errRefused
	}
	f.mu.Lock()
	f.n++
	if !f.countOnly {
		f.got[m.GetFrom()] = append(f.got[m.GetFrom()], m)
	}
	f.mu.Unlock()
	f.poke()
	return nil
}

func (f *fakeRaft) ReportUnreachable(id uint64) {
	f.mu.Lock()
	f.unreachable[id]++
	f.mu.Unlock()
	f.poke()
}

func (f *fakeRaft) ReportSnapshot(id uint64, status raft.SnapshotStatus) {
	f.mu.Lock()
	f.snaps = append(f.snaps, snapshotReport{to: id, status: status})
	f.mu.Unlock()
	f.poke()
}

func (f *fakeRaft) poke() {
	select {
	case f.changed <- struct{}{}:
	default:
	}
}

func (f *fakeRaft) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

func (f *fakeRaft) from(id uint64) []*raftpb.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*raftpb.Message(nil), f.got[id]...)
}

func (f *fakeRaft) unreachableCount(id uint64) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.unreachable[id]
}

func (f *fakeRaft) snapshotReports() []snapshotReport {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]snapshotReport(nil), f.snaps...)
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

// testConfig is a Config with fast reconnects, logging to the test's output (shown on failure or -v).
func testConfig(t testing.TB, id uint64, r Raft) Config {
	return Config{
		ClusterID:  0xC1,
		LocalID:    id,
		Raft:       r,
		BackoffMin: 2 * time.Millisecond,
		BackoffMax: 20 * time.Millisecond,
		Logger:     slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
}

// node is one transport with a real gRPC server on loopback.
type node struct {
	id   uint64
	tr   *Transport
	raft *fakeRaft
	addr string
	srv  *server
}

// server is a grpc.Server serving one listener, stoppable once.
type server struct {
	s    *grpc.Server
	done chan struct{}
	once sync.Once
}

func serve(t testing.TB, tr *Transport, lis net.Listener) *server {
	t.Helper()
	s := &server{s: grpc.NewServer(tr.ServerOptions()...), done: make(chan struct{})}
	tr.Register(s.s)
	go func() {
		defer close(s.done)
		_ = s.s.Serve(tr.Listener(lis))
	}()
	t.Cleanup(s.stop)
	return s
}

func (s *server) stop() {
	s.once.Do(func() {
		s.s.Stop()
		<-s.done
	})
}

func listen(t testing.TB, addr string) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	return lis
}

// deadAddr returns a loopback address nothing listens on, held for the rest of the test.
func deadAddr(t testing.TB) string { return loopback.ReservePort(t).Addr }

func newTransport(t testing.TB, cfg Config) *Transport {
	t.Helper()
	tr, err := New(cfg)
	if err != nil {
		t.Fatalf("new transport: %v", err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

// startNode starts a transport and its server; edit adjusts the config first.
func startNode(t testing.TB, id uint64, edit func(*Config)) *node {
	t.Helper()
	n := &node{id: id, raft: newFakeRaft()}
	cfg := testConfig(t, id, n.raft)
	if edit != nil {
		edit(&cfg)
	}
	n.tr = newTransport(t, cfg)
	lis := listen(t, "127.0.0.1:0")
	n.addr = lis.Addr().String()
	n.srv = serve(t, n.tr, lis)
	return n
}

// restart ends n as a process exit would (its server and transport, so its links close without a bye)
// and starts a new transport, with a new fakeRaft, and server on the same address.
func (n *node) restart(t testing.TB) {
	t.Helper()
	n.srv.stop()
	_ = n.tr.Close()
	n.raft = newFakeRaft()
	n.tr = newTransport(t, testConfig(t, n.id, n.raft))
	n.srv = serve(t, n.tr, listen(t, n.addr))
}

// connect makes every node a peer of every other.
func connect(nodes ...*node) {
	for _, a := range nodes {
		for _, b := range nodes {
			if a != b {
				a.tr.AddPeer(b.id, b.addr)
			}
		}
	}
}

func msg(typ raftpb.MessageType, from, to, index uint64) *raftpb.Message {
	return &raftpb.Message{Type: new(typ), From: new(from), To: new(to), Index: new(index), Term: new(uint64(1))}
}

func msgApp(from, to, index uint64, payload []byte) *raftpb.Message {
	m := msg(raftpb.MsgApp, from, to, index)
	m.Entries = []*raftpb.Entry{{Index: new(index + 1), Term: new(uint64(1)), Data: payload}}
	return m
}

func msgSnap(from, to uint64, data []byte) *raftpb.Message {
	m := msg(raftpb.MsgSnap, from, to, 0)
	m.Snapshot = &raftpb.Snapshot{
		Data: data,
		Metadata: &raftpb.SnapshotMetadata{
			Index:     new(uint64(10)),
			Term:      new(uint64(1)),
			ConfState: &raftpb.ConfState{Voters: []uint64{from, to}},
		},
	}
	return m
}

func countStatus(reps []snapshotReport, to uint64, status raft.SnapshotStatus) int {
	n := 0
	for _, r := range reps {
		if r.to == to && r.status == status {
			n++
		}
	}
	return n
}
