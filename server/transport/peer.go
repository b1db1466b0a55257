package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
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

// raftStream is the client side of one Raft.Stream call (to a peer that predates raw links).
type raftStream = grpc.ClientStreamingClient[wirepb.RaftBatch, wirepb.RaftStreamEnd]

// peer owns the link to one remote node: a bounded queue that Send fills without blocking, and one
// goroutine (run) that drains it into a single long-lived stream, reconnecting with backoff. The
// goroutine is started by the Transport and stopped by stop, which the Transport calls on RemovePeer,
// UpdatePeer and Close.
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
	// unsent counts the messages queued and not yet written or lost (queued, pending, being written):
	// Send writes directly only when it is 0, so nothing is overtaken (sendDirect).
	unsent atomic.Int64
	// direct is the open raw link, which Send may write to (nil: none, or a gRPC stream).
	direct atomic.Pointer[rawLink]

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{} // closed when run returns
	// heard wakes a backoff: the peer opened a stream to us, so it is up again (see contact).
	heard chan struct{}

	// Owned by run.
	pending  *raftpb.Message // taken from the queue but left out of the previous batch (too big)
	failures int             // consecutive failed attempts; drives the backoff and the log level
	opened   bool            // a link was opened before, so the next one is a reconnect
	oldPeer  bool            // the peer answered in gRPC once (logged once)
	// awaitReady: a backoff ended because the peer reached us (contact), so the next open waits for the
	// connection — still failing fast from the last failure — to come up, rather than fail at once.
	awaitReady bool
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
	var l link
	defer func() {
		if l != nil {
			p.direct.Store(nil)
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
			p.direct.Store(nil)
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
			p.direct.Store(nil)
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

// link is an open way of sending to the peer: a rawLink (rawlink.go), or the gRPC stream (streamLink)
// to a peer that predates links.
type link interface {
	// send writes msgs, to one peer, as one batch.
	send(msgs []*raftpb.Message) error
	// broken reports whether the link has already ended.
	broken() bool
	// close ends the link, waits for its goroutine and returns how the link ended.
	close() error
	// keepalive runs every KeepAliveTime on the peer goroutine.
	keepalive()
	openedAt() time.Time
}

// open starts a link to the peer: a raw link, or the gRPC stream when the peer predates links. A raw
// link is also the one Send may write to directly (sendDirect).
func (p *peer) open() (link, error) {
	var l link
	raw, err := p.dialLink()
	switch {
	case err == nil:
		l = raw
		p.awaitReady = false // it was for the gRPC connection's state, which a link does not use
	case errors.Is(err, errOldPeer) && !plantedNoFallback:
		if !p.oldPeer {
			p.logger().Info("peer serves only the gRPC raft stream (an older version): sending on it")
			p.oldPeer = true
		}
		if l, err = p.openStream(); err != nil {
			return nil, err
		}
	default:
		return nil, err
	}
	if p.opened {
		p.t.stats.reconnects.Add(1)
	}
	p.opened = true
	if raw != nil {
		p.direct.Store(raw)
	}
	return l, nil
}

// sendDirect writes msgs, all to this peer, as one batch on its raw link at once, from Send's
// goroutine (the node's Ready loop), when nothing else is waiting to go to the peer: that saves waking
// the peer goroutine, which on a busy machine costs tens of microseconds — more when the loop then
// blocks in its own disk write. It reports false when msgs must be queued: no raw link, something
// queued or being written (order), a snapshot or more than maxDirectBytes (the peer goroutine's job),
// the link busy, or its socket's send buffer too full to take them at once (a peer that reads slowly
// or not at all: see roomFor). A write that still cannot finish within directWriteTimeout closes the
// link; msgs are then lost and reported like any messages on a failed link.
func (p *peer) sendDirect(msgs []*raftpb.Message) bool {
	if p.unsent.Load() != 0 || p.direct.Load() == nil {
		return false
	}
	size := 0
	for _, m := range msgs {
		if m.GetType() == raftpb.MsgSnap {
			return false
		}
		size += wireSize(proto.Size(m))
	}
	if size > maxDirectBytes {
		return false
	}
	l := p.direct.Load()
	if l == nil || !l.mu.TryLock() {
		return false
	}
	defer l.mu.Unlock()
	// Checked again under the lock: every queued message is counted in unsent until written or lost,
	// and written only under this lock, so none can be overtaken.
	if p.unsent.Load() != 0 || l.broken() || !l.roomFor(size) {
		return false
	}
	if p.t.cfg.OnRoundTrip != nil {
		for _, m := range msgs {
			if m.GetType() == raftpb.MsgHeartbeat {
				p.heartbeatSent()
			}
		}
	}
	p.unsent.Add(int64(len(msgs))) // delivered or lose takes them back
	if err := l.writeLocked(msgs, directWriteTimeout); err != nil {
		p.lose(msgs)
		return true
	}
	p.t.stats.direct.Add(uint64(len(msgs)))
	p.delivered(msgs)
	return true
}

// streamLink is one open gRPC stream to a peer that predates links, with a goroutine that waits for its
// end. The client side of a client-streaming call otherwise learns that the peer ended it (a rejection,
// a restart) only from the next Send, which would lose that batch.
type streamLink struct {
	t      *Transport
	to     uint64
	stream raftStream
	opened time.Time
	cancel context.CancelFunc
	ended  chan struct{} // closed when the watcher's RecvMsg returns
	err    error         // how the stream ended; read only after ended is closed
}

// openStream starts a stream to the peer and its watcher goroutine, which streamLink.close stops and
// waits for.
func (p *peer) openStream() (*streamLink, error) {
	ctx, cancel := context.WithCancel(p.ctx)
	var opts []grpc.CallOption
	giveUp := func() bool { return true }
	if p.awaitReady {
		p.awaitReady = false
		opts = append(opts, grpc.WaitForReady(true))
		giveUp = time.AfterFunc(p.t.cfg.DialTimeout, cancel).Stop
	}
	s, err := p.client.Stream(ctx, opts...)
	if !giveUp() && err == nil {
		err = context.Canceled // the dial timeout fired just as the stream opened
	}
	if err != nil {
		cancel()
		return nil, err
	}
	l := &streamLink{t: p.t, to: p.id, stream: s, opened: time.Now(), cancel: cancel, ended: make(chan struct{})}
	go func() {
		defer close(l.ended)
		// The peer answers a Stream only when it ends it, so this returns at the stream's end: the peer's
		// status, or Canceled once close cancels the stream. gRPC allows it alongside Send.
		l.err = s.RecvMsg(new(wirepb.RaftStreamEnd))
		if l.err == nil {
			l.err = errors.New("peer closed the stream")
		}
	}()
	return l, nil
}

// send writes msgs as one RaftBatch.
func (l *streamLink) send(msgs []*raftpb.Message) error {
	batch, err := l.batch(msgs)
	if err != nil {
		return err
	}
	if err := l.stream.Send(batch); err != nil {
		if errors.Is(err, io.EOF) {
			// gRPC reports a stream the peer already ended as io.EOF; the status says why.
			return l.close()
		}
		return err
	}
	return nil
}

// batch encodes msgs as a RaftBatch, in one allocation for every message's encoding. It is not reused
// after Send: gRPC allows stats handlers to read a sent message lazily. collect computed every
// message's size.
func (l *streamLink) batch(msgs []*raftpb.Message) (*wirepb.RaftBatch, error) {
	total := 0
	for _, m := range msgs {
		total += cachedSize.Size(m)
	}
	buf := make([]byte, 0, total)
	batch := &wirepb.RaftBatch{
		ClusterId: l.t.cfg.ClusterID,
		From:      l.t.cfg.LocalID,
		To:        l.to,
		Messages:  make([][]byte, len(msgs)),
	}
	for i, m := range msgs {
		start := len(buf)
		var err error
		buf, err = cachedSize.MarshalAppend(buf, m)
		if err != nil {
			return nil, fmt.Errorf("marshal %v: %w", m.GetType(), err)
		}
		batch.Messages[i] = buf[start:len(buf):len(buf)]
	}
	return batch, nil
}

func (l *streamLink) broken() bool { return isClosed(l.ended) }

// close ends the stream, waits for the watcher and returns how the stream ended.
func (l *streamLink) close() error {
	l.cancel()
	<-l.ended
	return l.err
}

func (l *streamLink) keepalive() {} // gRPC pings the connection itself

func (l *streamLink) openedAt() time.Time { return l.opened }

// next returns the next message to send, blocking until there is one or the peer is stopped. Meanwhile
// it keeps l, if open, alive at every tick of keepalive.
func (p *peer) next(l link, keepalive <-chan time.Time) (*raftpb.Message, bool) {
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
func (p *peer) sent(l link, msgs []*raftpb.Message) {
	// A write is not proof that the peer accepts the link (it may reject it a moment later), so the
	// backoff resets only once a link has stayed up for a full BackoffMax.
	if p.failures > 0 && time.Since(l.openedAt()) >= p.t.cfg.BackoffMax {
		p.logger().Info("peer reachable again", slog.Int("failed_attempts", p.failures))
		p.failures = 0
	}
	p.delivered(msgs)
}

// delivered counts msgs, written as one batch, as sent (from the peer goroutine or sendDirect).
func (p *peer) delivered(msgs []*raftpb.Message) {
	p.t.stats.batches.Add(1)
	p.t.stats.sent.Add(uint64(len(msgs)))
	for _, m := range msgs {
		if m.GetType() == raftpb.MsgSnap {
			p.t.reports.reportSnapshot(p.id, raft.SnapshotFinish)
		}
	}
	p.unsent.Add(-int64(len(msgs)))
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
	p.unsent.Add(-int64(len(msgs)))
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
			p.awaitReady = true
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
	// gRPC's own reconnect backoff is left alone: ClientConn.ResetConnectBackoff races with gRPC's
	// balancer (v1.85). It is bounded by BackoffMax, which the server sets to half an election timeout.

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
