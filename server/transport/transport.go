package transport

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"sync"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
)

// Transport sends raft messages to peers and receives theirs. Create it with New; all methods are safe
// for concurrent use.
type Transport struct {
	cfg      Config
	log      *slog.Logger
	dialOpts []grpc.DialOption
	stats    counters
	reports  *reporter
	epoch    time.Time // origin of monoNow
	// proxy picks the HTTP CONNECT proxy for a link's dial (http.ProxyFromEnvironment; tests set another).
	proxy func(*http.Request) (*url.URL, error)

	// ctx is the transport's lifetime: Close cancels it, which stops every peer goroutine, the Listener's
	// goroutines, and ends every inbound link.
	ctx    context.Context
	cancel context.CancelFunc

	// mu guards peers and closed. Send holds it shared while it enqueues, so a peer that was removed
	// from the map under the exclusive lock can never receive another message.
	mu     sync.RWMutex
	peers  map[uint64]*peer
	closed bool

	// wg counts inbound goroutines: the Listener's accept loop and the goroutine
	// of each connection it sorts (a link's receiver). Peer goroutines are waited for through their own
	// done channels; the reporter through reports.done.
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// New returns a Transport with no peers. It starts one goroutine (the reporter); Close stops it.
func New(cfg Config) (*Transport, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("transport config: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t := &Transport{
		cfg:     cfg,
		log:     cfg.Logger.With(slog.String("component", "transport"), slog.String("local", leasepb.FormatID(cfg.LocalID))),
		reports: newReporter(cfg.Raft),
		epoch:   time.Now(),
		proxy:   http.ProxyFromEnvironment,
		ctx:     ctx,
		cancel:  cancel,
		peers:   make(map[uint64]*peer),
	}
	bc := backoff.DefaultConfig
	bc.BaseDelay, bc.MaxDelay = cfg.BackoffMin, cfg.BackoffMax
	if cfg.TLS == nil {
		t.dialOpts = append(t.dialOpts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	t.dialOpts = append(append(t.dialOpts,
		// gRPC keeps its own reconnect backoff per connection (up to two minutes by default); without
		// this a peer that comes back would stay unreachable long after our own backoff retried.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bc, MinConnectTimeout: cfg.DialTimeout}),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: cfg.KeepAliveTime, Timeout: cfg.KeepAliveTimeout, PermitWithoutStream: true}),
		grpc.WithInitialWindowSize(streamWindow),
		grpc.WithInitialConnWindowSize(connWindow),
		grpc.WithDefaultCallOptions(
			grpc.MaxCallSendMsgSize(cfg.MaxMsgBytes),
			grpc.MaxCallRecvMsgSize(cfg.MaxMsgBytes),
		),
	), cfg.DialOptions...)
	go t.reports.run()
	return t, nil
}

// AddPeer starts sending to peer id at addr (host:port). It adds the peer, or, if id is already known
// at another address, behaves like UpdatePeer. No connection is made until there is a message to send.
// Adding the local id, id 0 or any peer after Close does nothing.
func (t *Transport) AddPeer(id uint64, addr string) {
	t.setPeer(id, addr, true)
}

// UpdatePeer moves a known peer to a new address: the old connection is closed and messages still
// queued for it are dropped (and reported). It does nothing if the address is unchanged or the peer is
// unknown.
func (t *Transport) UpdatePeer(id uint64, addr string) {
	t.setPeer(id, addr, false)
}

func (t *Transport) setPeer(id uint64, addr string, add bool) {
	if id == 0 || id == t.cfg.LocalID {
		t.log.Warn("ignoring peer with invalid id", slog.String("peer", leasepb.FormatID(id)), slog.String("addr", addr))
		return
	}
	t.mu.RLock()
	old, known := t.peers[id]
	closed := t.closed
	t.mu.RUnlock()
	if closed || (!known && !add) || (known && old.addr == addr) {
		return
	}
	// Dial outside the lock: grpc.NewClient does no I/O, but there is no reason to stall Send on it.
	p, err := newPeer(t, id, addr)
	if err != nil {
		t.log.Error("cannot create peer client", slog.String("peer", leasepb.FormatID(id)), slog.String("addr", addr),
			slog.Any("err", err))
		return
	}

	t.mu.Lock()
	if t.closed || t.peers[id] != old {
		// Close or a concurrent AddPeer/UpdatePeer/RemovePeer won the race; theirs stands.
		t.mu.Unlock()
		p.discard()
		return
	}
	t.peers[id] = p
	p.start()
	t.mu.Unlock()

	if old != nil {
		old.stop()
		t.log.Info("peer address updated", slog.String("peer", leasepb.FormatID(id)), slog.String("from", old.addr),
			slog.String("to", addr))
	} else {
		t.log.Info("peer added", slog.String("peer", leasepb.FormatID(id)), slog.String("addr", addr))
	}
}

// RemovePeer stops sending to peer id, closes its connection and drops (and reports) the messages
// still queued for it. It returns when the peer's goroutine has exited.
func (t *Transport) RemovePeer(id uint64) {
	t.mu.Lock()
	p := t.peers[id]
	delete(t.peers, id)
	t.mu.Unlock()
	if p != nil {
		p.stop()
		t.log.Info("peer removed", slog.String("peer", leasepb.FormatID(id)))
	}
}

// Send queues msgs for their peers and returns without waiting for the network. Messages to one peer
// are sent in the order given. A message is dropped when its peer is unknown, its queue is full, or
// Config.Filter rejects it; raft is then told through ReportUnreachable (and ReportSnapshot with
// SnapshotFailure for a MsgSnap), later, from another goroutine. Send takes ownership of msgs: the
// caller must not modify them afterwards (raft does not). After Close, Send drops everything silently.
func (t *Transport) Send(msgs []*raftpb.Message) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.closed {
		t.stats.dropped.Add(uint64(len(msgs)))
		return
	}
	for _, m := range msgs {
		if f := t.cfg.Filter; f != nil && !f(m) {
			t.stats.filtered.Add(1)
			if m.GetType() == raftpb.MsgSnap {
				t.reports.reportSnapshot(m.GetTo(), raft.SnapshotFailure)
			}
			continue
		}
		p := t.peers[m.GetTo()]
		if p == nil {
			t.drop(m)
			continue
		}
		t.enqueue(p, m)
	}
}

// enqueue hands m to p's goroutine, or drops (and reports) it when p's queue is full.
func (t *Transport) enqueue(p *peer, m *raftpb.Message) {
	select {
	case p.queue <- m:
		if m.GetType() == raftpb.MsgHeartbeat && t.cfg.OnRoundTrip != nil {
			p.heartbeatSent()
		}
	default:
		t.drop(m)
	}
}

// drop counts m as dropped and tells raft, without blocking.
func (t *Transport) drop(m *raftpb.Message) {
	t.stats.dropped.Add(1)
	t.dropped(m.GetTo(), 1)
	t.reports.reportUnreachable(m.GetTo())
	if m.GetType() == raftpb.MsgSnap {
		t.reports.reportSnapshot(m.GetTo(), raft.SnapshotFailure)
	}
}

// dropped tells Config.OnDropped of count messages to peer that were lost.
func (t *Transport) dropped(peer uint64, count int) {
	if f := t.cfg.OnDropped; f != nil && count > 0 {
		f(peer, count)
	}
}

// heartbeatAnswered hands the round trip of the oldest unanswered heartbeat to peer to Config.OnRoundTrip.
func (t *Transport) heartbeatAnswered(peer uint64) {
	if t.cfg.OnRoundTrip == nil {
		return
	}
	t.mu.RLock()
	p := t.peers[peer]
	t.mu.RUnlock()
	if p == nil {
		return
	}
	if sent := p.heartbeatAt.Swap(0); sent != 0 {
		t.cfg.OnRoundTrip(peer, time.Duration(t.monoNow()-sent))
	}
}

// heardFrom is called when a peer opens a link to this node: if the link back to it is in backoff,
// the backoff ends (peer.contact).
func (t *Transport) heardFrom(id uint64) {
	t.mu.RLock()
	p := t.peers[id]
	t.mu.RUnlock()
	if p != nil {
		p.contact()
	}
}

// monoNow is a monotonic reading, in nanoseconds since New, never 0.
func (t *Transport) monoNow() int64 { return int64(time.Since(t.epoch)) + 1 }

// PeerClient returns a Raft service client on the connection to peer id, so the server can call
// Forward on the leader without a second connection. The client stops working (Canceled) once the peer
// is updated or removed; callers should fetch a fresh one per request.
func (t *Transport) PeerClient(id uint64) (wirepb.RaftClient, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	p := t.peers[id]
	if p == nil {
		return nil, false
	}
	return p.client, true
}

// Stats returns the transport's counters.
func (t *Transport) Stats() Stats {
	return t.stats.snapshot()
}

// Close stops every goroutine the transport started and waits for them: peer senders exit and close
// their connections, inbound links end, and pending reports are delivered to raft.
// It does not stop the grpc.Server the service is registered on. Close is idempotent and always
// returns nil.
func (t *Transport) Close() error {
	t.closeOnce.Do(func() {
		t.mu.Lock()
		t.closed = true
		peers := t.peers
		t.peers = nil
		t.mu.Unlock()

		t.cancel()
		for _, p := range peers {
			p.stop()
		}
		t.wg.Wait()
		// Only now can nobody record a report any more; the reporter delivers the last ones and exits.
		close(t.reports.stop)
		<-t.reports.done
	})
	return nil
}
