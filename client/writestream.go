package client

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
)

// The Writes stream. A batcher sends its batches, a write alone included, as requests on one long-lived
// Writes stream per connection (leases.proto) rather than as calls: a message on an open stream costs the
// client and the node a fraction of what a unary call does (HTTP/2 stream, headers, trailers, the node's
// handler goroutine), about a tenth of an acquire's time at one client (docs/benchmarks.md, "Writes
// over one stream"). Requests go out under ids and their answers come back in any order, read by one
// goroutine per stream.
//
// A stream that breaks fails the writes waiting on it as a call that broke would (their outcome unknown:
// they may have been delivered) and the next batch opens another. A node that drains (shuts down) says so:
// the stream takes no more requests, its side is closed, and the answers to what it carries still come.

// writeStream is one open Writes stream.
type writeStream struct {
	b      *batcher
	stream grpc.BidiStreamingClient[leasepb.WritesRequest, leasepb.WritesResponse]
	cancel context.CancelFunc // ends the stream (its context)

	sendMu sync.Mutex // gRPC allows one Send at a time

	mu      sync.Mutex
	pending map[uint64]*streamedBatch // sent, unanswered, by request id
	lastID  uint64
	closing bool // drained or broken: takes no more requests
}

// streamedBatch is a request in flight on a stream.
type streamedBatch struct {
	calls []*batchedWrite
	sent  time.Time
}

// viaStream sends calls as one request on the connection's Writes stream, opening it if need be.
func (b *batcher) viaStream(calls []*batchedWrite) {
	ws, err := b.openStream(calls[0].ctx)
	if err != nil {
		deliver(calls, nil, err, peer.Peer{}) // never sent
		return
	}
	ws.send(calls)
}

// openStream returns the connection's open stream, or opens one. Opening waits for the connection at
// most as long as ctx (the first caller's) allows, though the stream outlives it.
func (b *batcher) openStream(ctx context.Context) (*writeStream, error) {
	b.streamMu.Lock()
	defer b.streamMu.Unlock()
	switch {
	case b.closed:
		return nil, status.Error(codes.Canceled, "the client is closed")
	case b.stream != nil && !b.stream.isClosing():
		return b.stream, nil
	}
	sctx, cancel := context.WithCancel(b.ctx)
	stop := context.AfterFunc(ctx, cancel)
	st, err := b.api.Writes(sctx)
	if !stop() { // ctx ended while the stream was opening
		cancel()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if err != nil {
		cancel()
		return nil, err
	}
	ws := &writeStream{b: b, stream: st, cancel: cancel, pending: make(map[uint64]*streamedBatch)}
	b.stream = ws
	b.readers.Go(ws.read)
	return ws, nil
}

// send sends calls as one request, or fails them if the stream takes no more.
func (ws *writeStream) send(calls []*batchedWrite) {
	now := time.Now()
	writes, last, bounded := stampDeadlines(calls, now)
	req := &leasepb.WritesRequest{Writes: writes}
	ws.mu.Lock()
	if ws.closing {
		ws.mu.Unlock()
		deliver(calls, nil, status.Error(codes.Unavailable, "the write stream closed before the request was sent"), peer.Peer{})
		return
	}
	ws.lastID++
	req.Id = ws.lastID
	ws.pending[req.Id] = &streamedBatch{calls: calls, sent: now}
	ws.mu.Unlock()

	// A node that stops reading (frozen) fills the stream's window and blocks Send. Once no caller of the
	// batch waits any more (the latest deadline) the stream ends, and with it the wait; its pending writes
	// fail as unanswered. Not a caller's own context: one that ends while Send runs normally would cut
	// the stream for everyone.
	var watchdog *time.Timer
	if bounded {
		watchdog = time.AfterFunc(time.Until(last), ws.cancel)
	}
	ws.sendMu.Lock()
	err := ws.stream.Send(req)
	ws.sendMu.Unlock()
	if watchdog != nil {
		watchdog.Stop()
	}
	if err != nil {
		ws.markClosing()
		if sb := ws.take(req.Id); sb != nil { // not handed to the connection
			deliver(sb.calls, nil, status.Error(codes.Unavailable, "the write stream broke before the request was sent"), peer.Peer{})
		}
	}
}

// read hands each answer to its request's callers until the stream ends, then fails what is left.
func (ws *writeStream) read() {
	defer ws.cancel()
	for {
		resp, err := ws.stream.Recv()
		if err != nil {
			ws.end(err)
			return
		}
		if resp.GetDraining() {
			ws.drain()
			continue
		}
		if sb := ws.take(resp.GetId()); sb != nil {
			ws.answer(sb, resp)
		}
	}
}

// answer hands each call of sb its result from resp. The request is counted first, so that a caller
// who has its answer finds it counted, as after a unary call.
func (ws *writeStream) answer(sb *streamedBatch, resp *leasepb.WritesResponse) {
	var err error
	if resp.GetError() != nil {
		err = status.ErrorProto(resp.GetError())
	}
	ws.b.metrics.writesRequest(status.Code(err), sb.sent)
	deliver(sb.calls, resp.GetResults(), err, peer.Peer{Addr: ws.b.target})
}

// drain: the node shuts down. The stream takes no more requests and its side closes; the node still
// answers what it received.
func (ws *writeStream) drain() {
	ws.markClosing()
	ws.sendMu.Lock()
	defer ws.sendMu.Unlock()
	_ = ws.stream.CloseSend()
}

// end fails the requests left unanswered when the stream ended with err.
func (ws *writeStream) end(err error) {
	ws.markClosing()
	ws.mu.Lock()
	left := ws.pending
	ws.pending = nil
	ws.mu.Unlock()
	if errors.Is(err, io.EOF) {
		err = status.Error(codes.Unavailable, "the node ended the write stream without answering")
	}
	for _, sb := range left {
		ws.b.metrics.writesRequest(status.Code(err), sb.sent)
		deliver(sb.calls, nil, err, peer.Peer{Addr: ws.b.target}) // delivered, perhaps: the outcome is unknown
	}
}

// take removes and returns the request id from the pending ones (nil: answered or failed already).
func (ws *writeStream) take(id uint64) *streamedBatch {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	sb := ws.pending[id]
	delete(ws.pending, id)
	return sb
}

func (ws *writeStream) markClosing() {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.closing = true
}

func (ws *writeStream) isClosing() bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.closing
}
