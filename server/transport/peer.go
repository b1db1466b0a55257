package transport

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
)

// peer owns the link to one remote node: a bounded queue that Send fills without blocking, and one
// goroutine (run) that drains it into a single long-lived link, reconnecting with backoff. The
// goroutine is started by the Transport and stopped by stop, which the Transport calls on RemovePeer,
// UpdatePeer and Close. conn is the gRPC connection to the peer, for Forward and Join calls only.
type peer struct {
	t      *Transport
	id     uint64
	addr   string
	conn   *grpc.ClientConn
	client wirepb.RaftClient
	queue  chan *raftpb.Message
	// heartbeatAt is when the oldest heartbeat not yet answered was handed to Send (Transport.monoNow;
	// 0: none), for Config.OnRoundTrip.
	heartbeatAt atomic.Int64

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{} // closed when run returns
	// heard wakes a backoff: the peer opened a link to us, so it is up again (see contact).
	heard chan struct{}

	// Owned by run.
	pending  *raftpb.Message // taken from the queue but left out of the previous batch (too big)
	failures int             // consecutive failed attempts; drives the backoff and the log level
	opened   bool            // a link was opened before, so the next one is a reconnect
}

func newPeer(t *Transport, id uint64, addr string) (*peer, error) {
	opts := t.dialOpts
	if t.cfg.TLS != nil {
		opts = append(slices.Clip(opts), t.dialCredentials(id))
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("create client for %s: %w", addr, err)
	}
	ctx, cancel := context.WithCancel(t.ctx)
	return &peer{
		t:      t,
		id:     id,
		addr:   addr,
		conn:   conn,
		client: wirepb.NewRaftClient(conn),
		queue:  make(chan *raftpb.Message, t.cfg.QueueSize),
		ctx:    ctx,
		cancel: cancel,
		done:   make(chan struct{}),
		heard:  make(chan struct{}, 1),
	}, nil
}

func (p *peer) start() { go p.run() }

// stop ends run, waits for it and closes the connection. Messages still queued are dropped and reported.
func (p *peer) stop() {
	p.cancel()
	<-p.done
	_ = p.conn.Close()
}

// discard releases a peer whose goroutine was never started.
func (p *peer) discard() {
	p.cancel()
	_ = p.conn.Close()
}

func (p *peer) logger() *slog.Logger {
	return p.t.log.With(slog.String("peer", leasepb.FormatID(p.id)), slog.String("addr", p.addr))
}

// run sends queued messages until the peer is stopped. The link is opened lazily, when there is
// something to send, so idle peers cost no connection attempts.
func (p *peer) run() {
	defer close(p.done)
	var l *rawLink
	defer func() {
		if l != nil {
			l.close()
		}
		p.dropQueued()
	}()
	keepalive := time.NewTicker(p.t.cfg.KeepAliveTime)
	defer keepalive.Stop()

	for {
		first, ok := p.next(l, keepalive.C)
		if !ok {
			return
		}
		if l != nil && l.broken() {
			// The peer ended the link (a rejection, a restart) or the connection dropped while we were
			// idle. Treat it as a failed send so a peer that keeps refusing us gets backoff, not a tight
			// reconnect loop.
			err := l.close()
			l = nil
			p.fail([]*raftpb.Message{first}, fmt.Errorf("link ended: %w", err))
			if !p.backoff() {
				return
			}
			continue
		}
		if l == nil {
			var err error
			if l, err = p.open(); err != nil {
				p.fail([]*raftpb.Message{first}, fmt.Errorf("open link: %w", err))
				if !p.backoff() {
					return
				}
				continue
			}
		}
		msgs, err := p.collect(first)
		if err != nil {
			// A message that cannot travel at all says nothing about the link; keep it.
			p.logger().Warn("dropping unsendable raft message", slog.Any("err", err))
			p.lose(msgs)
			continue
		}
		if err := l.send(msgs); err != nil {
			l.close()
			l = nil
			p.fail(msgs, fmt.Errorf("send batch: %w", err))
			if !p.backoff() {
				return
			}
			continue
		}
		p.sent(l, msgs)
	}
}

// open dials a link to the peer.
func (p *peer) open() (*rawLink, error) {
	l, err := p.dialLink()
	if err != nil {
		return nil, err
	}
	if p.opened {
		p.t.stats.reconnects.Add(1)
	}
	p.opened = true
	return l, nil
}

// next returns the next message to send, blocking until there is one or the peer is stopped. Meanwhile
// it keeps l, if open, alive at every tick of keepalive.
func (p *peer) next(l *rawLink, keepalive <-chan time.Time) (*raftpb.Message, bool) {
	if m := p.pending; m != nil {
		p.pending = nil
		return m, true
	}
	for {
		select {
		case m := <-p.queue:
			return m, true
		case <-p.ctx.Done():
			return nil, false
		case <-keepalive:
			if l != nil && !l.broken() {
				l.keepalive()
			}
		}
	}
}

// collect gathers one batch starting with first and adding whatever is already queued, within the batch
// limits. It never waits for more messages: batching comes from messages that piled up while the
// previous batch was on the wire, so an idle link adds no latency. On error (first is too large to send
// at all) the messages returned are the ones lost.
func (p *peer) collect(first *raftpb.Message) ([]*raftpb.Message, error) {
	cfg := &p.t.cfg
	// A batch must also fit in one message of the receiver's limit, whatever MaxBatchBytes says.
	limit := min(cfg.MaxBatchBytes, cfg.MaxMsgBytes-batchOverhead)
	msgs := []*raftpb.Message{first}
	size := proto.Size(first)
	if wireSize(size) > cfg.MaxMsgBytes-batchOverhead {
		return msgs, fmt.Errorf("%v of %d bytes exceeds the %d byte message limit",
			first.GetType(), size, cfg.MaxMsgBytes)
	}
	wire := wireSize(size)
fill:
	for len(msgs) < cfg.MaxBatchMessages && wire < limit {
		select {
		case m := <-p.queue:
			n := wireSize(proto.Size(m))
			if wire+n > limit {
				// Keep it for the next batch rather than reorder or overflow this one.
				p.pending = m
				break fill
			}
			msgs = append(msgs, m)
			wire += n
		default:
			break fill
		}
	}
	return msgs, nil
}

// wireSize is the room a message of n bytes takes in RaftBatch.messages: tag, length and payload.
func wireSize(n int) int {
	return 1 + protowire.SizeBytes(n)
}

// sent records a successful write of msgs on l by the peer goroutine.
func (p *peer) sent(l *rawLink, msgs []*raftpb.Message) {
	// A write is not proof that the peer accepts the link (it may reject it a moment later), so the
	// backoff resets only once a link has stayed up for a full BackoffMax.
	if p.failures > 0 && time.Since(l.opened) >= p.t.cfg.BackoffMax {
		p.logger().Info("peer reachable again", slog.Int("failed_attempts", p.failures))
		p.failures = 0
	}
	p.t.stats.batches.Add(1)
	p.t.stats.sent.Add(uint64(len(msgs)))
	for _, m := range msgs {
		if m.GetType() == raftpb.MsgSnap {
			p.t.reports.reportSnapshot(p.id, raft.SnapshotFinish)
		}
	}
}

// fail records that msgs were lost because of err.
func (p *peer) fail(msgs []*raftpb.Message, err error) {
	if p.ctx.Err() != nil {
		// Stopping, not failing: the messages are still lost and reported, but not logged as an error.
		p.lose(msgs)
		return
	}
	p.failures++
	p.t.stats.sendFailures.Add(1)
	log := p.logger()
	if p.failures == 1 {
		log.Warn("peer unreachable", slog.Any("err", err))
	} else {
		log.Debug("peer still unreachable", slog.Int("failed_attempts", p.failures), slog.Any("err", err))
	}
	p.lose(msgs)
}

// heartbeatSent records a heartbeat handed to Send, unless an earlier one is still unanswered (and not
// so old that it must have been lost).
func (p *peer) heartbeatSent() {
	now := p.t.monoNow()
	if old := p.heartbeatAt.Load(); old == 0 || now-old > int64(maxRoundTrip) {
		p.heartbeatAt.CompareAndSwap(old, now)
	}
}

// maxRoundTrip is the oldest unanswered heartbeat a response is still matched to.
const maxRoundTrip = 10 * time.Second

// lose counts msgs as dropped and reports them to raft.
func (p *peer) lose(msgs []*raftpb.Message) {
	p.t.stats.dropped.Add(uint64(len(msgs)))
	p.t.dropped(p.id, len(msgs))
	for _, m := range msgs {
		if m.GetType() == raftpb.MsgHeartbeat {
			p.heartbeatAt.Store(0) // its answer will not come
		}
	}
	p.t.reports.reportUnreachable(p.id)
	for _, m := range msgs {
		if m.GetType() == raftpb.MsgSnap {
			p.t.reports.reportSnapshot(p.id, raft.SnapshotFailure)
		}
	}
}

// backoff waits before the next attempt, dropping (and reporting) whatever is queued meanwhile: raft
// is better served by prompt unreachable reports than by a backlog of stale messages replayed after
// the peer returns. It reports false if the peer was stopped.
func (p *peer) backoff() bool {
	timer := time.NewTimer(backoffDelay(p.t.cfg.BackoffMin, p.t.cfg.BackoffMax, p.failures))
	defer timer.Stop()
	if p.pending != nil {
		p.lose([]*raftpb.Message{p.pending})
		p.pending = nil
	}
	for {
		select {
		case <-timer.C:
			return true
		case <-p.heard:
			return true
		case <-p.ctx.Done():
			return false
		case m := <-p.queue:
			p.lose([]*raftpb.Message{m})
		}
	}
}

// contact tells a peer in backoff that the node has heard from it: a peer that restarted is back at
// once, and waiting out a backoff of up to BackoffMax (several election timeouts) would keep its votes
// and the leader's entries from it — a restarted follower could delay the next election by seconds.
func (p *peer) contact() {
	select {
	case p.heard <- struct{}{}:
	default:
	}
}

// dropQueued drops and reports everything left in the queue once the peer is stopped. The peer is
// already out of the Transport's map, so nothing can be queued after this.
func (p *peer) dropQueued() {
	if p.pending != nil {
		p.lose([]*raftpb.Message{p.pending})
		p.pending = nil
	}
	for {
		select {
		case m := <-p.queue:
			p.lose([]*raftpb.Message{m})
		default:
			return
		}
	}
}

// backoffDelay is the wait before retry number failures (1 for the first): exponential from lo, capped
// at hi, drawn uniformly from [d/2, d] so peers that failed together do not retry in lockstep.
func backoffDelay(lo, hi time.Duration, failures int) time.Duration {
	d := hi
	if shift := failures - 1; shift >= 0 && shift < 32 {
		if e := lo << shift; e > 0 && e < hi {
			d = e
		}
	}
	half := d / 2
	return half + rand.N(d-half+1)
}
