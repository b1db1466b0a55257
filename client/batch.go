package client

import (
	"context"
	"net"
	"runtime"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
)

// Batching. The quick writes (Acquire without WithWait, Renew, Release) that goroutines of one Client make
// on one connection at the same moment go to the node as one request on the connection's Writes stream
// (writestream.go); the node runs each as its own call would run and answers each on its own. A gRPC call costs the client and the node tens of microseconds of CPU
// whatever it carries (its stream, headers, the node's handler goroutine and interceptors, a flush on each
// side); under load that is a third to a half of a write's cost, and paying it once per batch lets a busy
// client and its cluster do 1.3–1.5 times the writes on the same cores (docs/benchmarks.md, "Batching").
//
// Nothing waits for a batch to fill: the first write of a moment forms a batch, yields the processor once
// so that the writes made at the same instant (typically by the goroutines one answer just woke) can join
// it, and sends it. A write alone goes as a request of one. Each caller still waits only as long as its own context allows: its attempt's
// deadline travels with its write (BatchWrite.timeout_ms), and a caller whose context ends returns at once,
// as it would from its own call, while the others in the batch go on.

// maxBatchWrites is the most writes a Writes request carries (leases.proto; server.MaxBatchWrites).
const maxBatchWrites = 64

// batcher coalesces the quick writes made on one connection and sends them on its Writes stream
// (writestream.go).
type batcher struct {
	api     leasepb.LeasesClient
	target  net.Addr // the connection's endpoint: the peer a batch that may have been sent is attributed to
	metrics *clientMetrics
	// alone: every write goes as its own call (Config.NoBatching).
	alone bool

	ctx      context.Context // the client's: streams live under it
	streamMu sync.Mutex
	stream   *writeStream   // the open stream; nil before the first batch
	closed   bool           // under streamMu: no stream opens any more
	readers  sync.WaitGroup // the streams' readers

	// yield lets the writes made at the same instant as a batch's first join it (runtime.Gosched; tests
	// replace it).
	yield func()

	mu      sync.Mutex
	forming *batch // open for writes to join; nil when none is
}

// batch is a set of writes sent as one call.
type batch struct {
	calls []*batchedWrite
	taken bool // under batcher.mu: the former took the calls to send them; none joins or leaves after
}

// batchedWrite is one caller's write, waiting for its answer.
type batchedWrite struct {
	ctx   context.Context
	write *leasepb.BatchWrite
	batch *batch
	left  bool // under batcher.mu: the caller's context ended before the batch was taken

	done   chan struct{} // closed when res, err and sentTo are set
	res    *leasepb.BatchResult
	err    error
	sentTo peer.Peer // the node the write's call reached (Addr nil: it reached none)
}

func newBatcher(ctx context.Context, conn *grpc.ClientConn, addr string, off bool, m *clientMetrics) *batcher {
	return &batcher{api: leasepb.NewLeasesClient(conn), target: endpointAddr(addr), metrics: m, ctx: ctx, alone: off, yield: runtime.Gosched}
}

// close waits for the streams' readers to end (the client's context has ended: so do the streams) and
// opens no stream any more.
func (b *batcher) close() {
	b.streamMu.Lock()
	b.closed = true
	b.streamMu.Unlock()
	b.readers.Wait()
}

// endpointAddr names an endpoint as a net.Addr.
type endpointAddr string

func (a endpointAddr) Network() string { return "tcp" }
func (a endpointAddr) String() string  { return string(a) }

func (b *batcher) acquire(ctx context.Context, req *leasepb.AcquireRequest, opts ...grpc.CallOption) (*leasepb.AcquireResponse, error) {
	if req.GetWait() || b.alone {
		return b.api.Acquire(ctx, req, opts...)
	}
	res, err := b.do(ctx, &leasepb.BatchWrite{Write: &leasepb.BatchWrite_Acquire{Acquire: req}}, opts)
	return res.GetAcquire(), err
}

func (b *batcher) renew(ctx context.Context, req *leasepb.RenewRequest, opts ...grpc.CallOption) (*leasepb.RenewResponse, error) {
	if b.alone {
		return b.api.Renew(ctx, req, opts...)
	}
	res, err := b.do(ctx, &leasepb.BatchWrite{Write: &leasepb.BatchWrite_Renew{Renew: req}}, opts)
	return res.GetRenew(), err
}

func (b *batcher) release(ctx context.Context, req *leasepb.ReleaseRequest, opts ...grpc.CallOption) (*leasepb.ReleaseResponse, error) {
	if b.alone {
		return b.api.Release(ctx, req, opts...)
	}
	res, err := b.do(ctx, &leasepb.BatchWrite{Write: &leasepb.BatchWrite_Release{Release: req}}, opts)
	return res.GetRelease(), err
}

// do sends w in the batch being formed, or forms one, and returns its answer. The caller's grpc.Peer
// option (opts) learns the node the write reached, as from its own call.
func (b *batcher) do(ctx context.Context, w *leasepb.BatchWrite, opts []grpc.CallOption) (*leasepb.BatchResult, error) {
	call := &batchedWrite{ctx: ctx, write: w, done: make(chan struct{})}
	if b.join(call) {
		b.yield()
		if calls := b.take(call.batch); len(calls) > 0 {
			b.viaStream(calls)
		}
	}
	p := peerOption(opts)
	select {
	case <-call.done:
		return call.answer(p)
	case <-ctx.Done():
	}
	if b.leave(call) {
		select {
		case <-call.done: // answered as the context ended: the answer says more
			return call.answer(p)
		default:
		}
		if p != nil && p.Addr == nil {
			p.Addr = b.target // it may have reached the node: its outcome is unknown
		}
	}
	// What gRPC answers a call whose context ends: DeadlineExceeded or Canceled.
	return nil, status.FromContextError(ctx.Err()).Err()
}

// answer is the write's answer, and tells the caller's grpc.Peer option (p, if any) the node it reached.
func (c *batchedWrite) answer(p *peer.Peer) (*leasepb.BatchResult, error) {
	if p != nil {
		*p = c.sentTo
	}
	return c.res, c.err
}

// join adds call to the batch being formed, or forms one; it reports whether call formed it (and must
// send it).
func (b *batcher) join(call *batchedWrite) (former bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.forming == nil {
		b.forming, former = &batch{}, true
	}
	call.batch = b.forming
	b.forming.calls = append(b.forming.calls, call)
	if len(b.forming.calls) == maxBatchWrites {
		b.forming = nil // full: the next write forms another
	}
	return former
}

// take closes bt to joining and leaving, and returns its calls whose callers still wait.
func (b *batcher) take(bt *batch) []*batchedWrite {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.forming == bt {
		b.forming = nil
	}
	bt.taken = true
	live := make([]*batchedWrite, 0, len(bt.calls))
	for _, c := range bt.calls {
		if !c.left {
			live = append(live, c)
		}
	}
	return live
}

// leave withdraws the write of a caller whose context ended, if its batch was not taken yet (then it is
// never sent); it reports whether the write may have been sent.
func (b *batcher) leave(call *batchedWrite) (mayBeSent bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !call.batch.taken {
		call.left = true
		return false
	}
	return true
}

// stampDeadlines sets each call's timeout_ms from its caller's deadline (counted from now), so that no
// write outlives its caller on the node, and returns the writes and the latest deadline among the callers
// (bounded false: one has none).
func stampDeadlines(calls []*batchedWrite, now time.Time) (writes []*leasepb.BatchWrite, latest time.Time, bounded bool) {
	writes = make([]*leasepb.BatchWrite, len(calls))
	bounded = true
	for i, c := range calls {
		writes[i] = c.write
		dl, ok := c.ctx.Deadline()
		if !ok {
			bounded = false
			continue
		}
		c.write.TimeoutMs = timeoutMs(dl.Sub(now))
		if dl.After(latest) {
			latest = dl
		}
	}
	return writes, latest, bounded
}

// deliver hands each call its result from results (in the calls' order), or err when the batch failed as
// a whole, with the node it reached (sentTo; Addr nil: it reached none).
func deliver(calls []*batchedWrite, results []*leasepb.BatchResult, err error, sentTo peer.Peer) {
	if err == nil && len(results) != len(calls) {
		err = status.Errorf(codes.Internal, "a batch of %d writes was answered with %d results", len(calls), len(results))
	}
	for i, c := range calls {
		switch {
		case err != nil:
			c.err = err
		case results[i].GetError() != nil:
			c.err = status.ErrorProto(results[i].GetError())
		default:
			c.res = results[i]
		}
		c.sentTo = sentTo
		close(c.done)
	}
}

// timeoutMs is d in whole milliseconds, rounded up, at least 1.
func timeoutMs(d time.Duration) uint32 {
	ms := (d + time.Millisecond - 1) / time.Millisecond
	return uint32(min(max(ms, 1), 1<<31))
}

// peerOption is the grpc.Peer option among opts, if any.
func peerOption(opts []grpc.CallOption) *peer.Peer {
	for _, o := range opts {
		if p, ok := o.(grpc.PeerCallOption); ok {
			return p.PeerAddr
		}
	}
	return nil
}
