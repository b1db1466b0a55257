package client

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
)

// fakeLeases answers the batcher's calls and the requests of its Writes stream: each Acquire is granted
// with its resource's length as the token, unless the resource is "held" (FailedPrecondition). A call or
// request waits for release (when set) first.
type fakeLeases struct {
	leasepb.LeasesClient // the methods the batcher does not call: nil, they would panic

	release  chan struct{} // calls wait for it to close, when set
	batchErr error         // every Writes request fails with it
	started  chan struct{} // each call sends here once it reached the node, when set
	mu       sync.Mutex
	batches  [][]*leasepb.BatchWrite // what each Writes request carried
	unary    []string                // the resources of the writes sent as their own calls
}

// fakeNode is the node the fake's calls and streams reach (the batcher's target).
var fakeNode net.Addr = endpointAddr("node:1")

func (f *fakeLeases) arrive(ctx context.Context, opts []grpc.CallOption) error {
	if p := peerOption(opts); p != nil {
		p.Addr = fakeNode
	}
	if f.started != nil {
		f.started <- struct{}{}
	}
	if f.release != nil {
		select {
		case <-f.release:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
	return nil
}

func grant(req *leasepb.AcquireRequest) (*leasepb.AcquireResponse, error) {
	if req.GetResource() == "held" {
		return nil, status.Error(codes.FailedPrecondition, "held by someone else")
	}
	return &leasepb.AcquireResponse{Lease: &leasepb.Lease{Resource: req.GetResource(), Token: uint64(len(req.GetResource()))}}, nil
}

func (f *fakeLeases) Acquire(ctx context.Context, req *leasepb.AcquireRequest, opts ...grpc.CallOption) (*leasepb.AcquireResponse, error) {
	f.mu.Lock()
	f.unary = append(f.unary, req.GetResource())
	f.mu.Unlock()
	if err := f.arrive(ctx, opts); err != nil {
		return nil, err
	}
	return grant(req)
}

func (f *fakeLeases) Writes(ctx context.Context, _ ...grpc.CallOption) (grpc.BidiStreamingClient[leasepb.WritesRequest, leasepb.WritesResponse], error) {
	return &fakeStream{f: f, ctx: ctx, answers: make(chan *leasepb.WritesResponse, maxBatchWrites)}, nil
}

// fakeStream is a Writes stream to fakeLeases: each request is answered on a goroutine of its own.
type fakeStream struct {
	grpc.ClientStream // the methods the batcher does not call: nil, they would panic
	f                 *fakeLeases
	ctx               context.Context
	answers           chan *leasepb.WritesResponse
}

func (s *fakeStream) Send(req *leasepb.WritesRequest) error {
	s.f.mu.Lock()
	s.f.batches = append(s.f.batches, req.GetWrites())
	s.f.mu.Unlock()
	go func() {
		resp := s.f.answer(s.ctx, req)
		select {
		case s.answers <- resp:
		case <-s.ctx.Done():
		}
	}()
	return nil
}

func (s *fakeStream) Recv() (*leasepb.WritesResponse, error) {
	select {
	case resp := <-s.answers:
		return resp, nil
	case <-s.ctx.Done():
		return nil, status.FromContextError(s.ctx.Err()).Err()
	}
}

func (s *fakeStream) CloseSend() error { return nil }

// answer is the node's answer to a Writes request.
func (f *fakeLeases) answer(ctx context.Context, req *leasepb.WritesRequest) *leasepb.WritesResponse {
	resp := &leasepb.WritesResponse{Id: req.GetId()}
	err := f.arrive(ctx, nil)
	if f.batchErr != nil {
		err = f.batchErr
	}
	if err != nil {
		resp.Error = status.Convert(err).Proto()
		return resp
	}
	for _, w := range req.GetWrites() {
		switch op := w.GetWrite().(type) {
		case *leasepb.BatchWrite_Acquire:
			a, err := grant(op.Acquire)
			if err != nil {
				resp.Results = append(resp.Results, &leasepb.BatchResult{Result: &leasepb.BatchResult_Error{Error: status.Convert(err).Proto()}})
				continue
			}
			resp.Results = append(resp.Results, &leasepb.BatchResult{Result: &leasepb.BatchResult_Acquire{Acquire: a}})
		case *leasepb.BatchWrite_Renew:
			resp.Results = append(resp.Results, &leasepb.BatchResult{Result: &leasepb.BatchResult_Renew{Renew: &leasepb.RenewResponse{TtlMs: 1000}}})
		}
	}
	return resp
}

func (f *fakeLeases) batchSizes() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	var sizes []int
	for _, b := range f.batches {
		sizes = append(sizes, len(b))
	}
	return sizes
}

// callBatcher is a batcher over f whose streams end with the test (writestream_internal_test.go tests the
// stream against a gRPC server).
func callBatcher(t *testing.T, f *fakeLeases) *batcher {
	b := &batcher{api: f, target: fakeNode, ctx: t.Context(), yield: func() {}}
	t.Cleanup(b.close)
	return b
}

// gatedBatcher is a callBatcher over f whose batches form until want writes joined (or the batch is full).
func gatedBatcher(t *testing.T, f *fakeLeases, want int) *batcher {
	b := callBatcher(t, f)
	b.yield = func() {
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			b.mu.Lock()
			full := b.forming == nil // the former's batch is the one forming until it is full
			n := 0
			if !full {
				n = len(b.forming.calls)
			}
			b.mu.Unlock()
			if full || n >= want {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
	return b
}

// acquireAll acquires each resource from its own goroutine and returns the answers in order.
func acquireAll(ctx context.Context, b *batcher, resources []string) ([]*leasepb.AcquireResponse, []error, []peer.Peer) {
	resps, errs, peers := make([]*leasepb.AcquireResponse, len(resources)), make([]error, len(resources)), make([]peer.Peer, len(resources))
	var wg sync.WaitGroup
	for i, r := range resources {
		wg.Go(func() {
			resps[i], errs[i] = b.acquire(ctx, &leasepb.AcquireRequest{Resource: r}, grpc.Peer(&peers[i]))
		})
	}
	wg.Wait()
	return resps, errs, peers
}

func TestWritesMadeTogetherTravelAsOneBatch(t *testing.T) {
	f := &fakeLeases{}
	b := gatedBatcher(t, f, 5)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resources := []string{"a", "bb", "held", "dddd", "eeeee"}
	resps, errs, peers := acquireAll(ctx, b, resources)
	if sizes := f.batchSizes(); len(sizes) != 1 || sizes[0] != 5 || len(f.unary) != 0 {
		t.Fatalf("batches %v and %d calls of their own, want one batch of 5", sizes, len(f.unary))
	}
	for i, r := range resources {
		if peers[i].Addr != fakeNode {
			t.Errorf("%s: peer %v, want the node the batch reached", r, peers[i].Addr)
		}
		if r == "held" {
			if status.Code(errs[i]) != codes.FailedPrecondition {
				t.Errorf("held: %v, want its own FailedPrecondition", errs[i])
			}
			continue
		}
		if errs[i] != nil || resps[i].GetLease().GetResource() != r || resps[i].GetLease().GetToken() != uint64(len(r)) {
			t.Errorf("%s: %v, %v; want its own grant", r, resps[i], errs[i])
		}
	}
}

// A write alone goes as a request of one; a waiting acquire never joins a batch: it may wait long, and a
// batch answers when its last write does.
func TestOnlyAWaitingAcquireGoesAsItsOwnCall(t *testing.T) {
	f := &fakeLeases{}
	b := callBatcher(t, f)
	var p peer.Peer
	resp, err := b.acquire(context.Background(), &leasepb.AcquireRequest{Resource: "a"}, grpc.Peer(&p))
	if err != nil || resp.GetLease().GetResource() != "a" || p.Addr != fakeNode {
		t.Fatalf("acquire = %v, %v (peer %v)", resp, err, p.Addr)
	}
	if sizes := f.batchSizes(); len(sizes) != 1 || sizes[0] != 1 || len(f.unary) != 0 {
		t.Fatalf("batches %v, %d calls of their own; want the write as a request of one", sizes, len(f.unary))
	}
	if _, err := b.acquire(context.Background(), &leasepb.AcquireRequest{Resource: "w", Wait: true}); err != nil || len(f.unary) != 1 {
		t.Fatalf("waiting acquire: %v, %d calls of their own", err, len(f.unary))
	}
}

func TestABatchCarriesAtMost64Writes(t *testing.T) {
	f := &fakeLeases{}
	b := gatedBatcher(t, f, maxBatchWrites)
	resources := make([]string, maxBatchWrites+6)
	for i := range resources {
		resources[i] = fmt.Sprintf("r%d", i)
	}
	var wg sync.WaitGroup
	for _, r := range resources[:maxBatchWrites] { // fill the first batch before the rest arrive
		wg.Go(func() { _, _ = b.acquire(context.Background(), &leasepb.AcquireRequest{Resource: r}) })
	}
	waitFor(t, "the first batch", func() bool { return len(f.batchSizes()) == 1 })
	b.yield = func() {} // the second forms without waiting
	_, errs, _ := acquireAll(context.Background(), b, resources[maxBatchWrites:])
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	total := 0
	for _, n := range f.batchSizes() {
		if n > maxBatchWrites {
			t.Fatalf("a batch of %d writes", n)
		}
		total += n
	}
	if total+len(f.unary) != len(resources) || f.batchSizes()[0] != maxBatchWrites {
		t.Fatalf("batches %v and %d calls of their own for %d writes", f.batchSizes(), len(f.unary), len(resources))
	}
}

// A caller whose context ends before its batch is sent returns at once, and its write is never sent (its
// peer stays unset: the SDK knows it cannot have taken effect).
func TestAWriteLeftBeforeItsBatchIsSentIsNotSent(t *testing.T) {
	f := &fakeLeases{}
	b := callBatcher(t, f)
	leftReturned := make(chan struct{})
	b.yield = func() { <-leftReturned } // the batch is sent only after the leaver returned
	leaving, cancel := context.WithCancel(context.Background())
	var leaverPeer peer.Peer
	var leaverErr error
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = b.acquire(context.Background(), &leasepb.AcquireRequest{Resource: "stays"}) })
	waitFor(t, "the first write to form a batch", func() bool { return b.formingLen() == 1 })
	wg.Go(func() {
		_, leaverErr = b.acquire(leaving, &leasepb.AcquireRequest{Resource: "leaves"}, grpc.Peer(&leaverPeer))
		close(leftReturned)
	})
	waitFor(t, "the second write to join", func() bool { return b.formingLen() == 2 })
	cancel()
	wg.Wait()
	if status.Code(leaverErr) != codes.Canceled || leaverPeer.Addr != nil {
		t.Fatalf("the leaver got %v with peer %v; want Canceled, never sent", leaverErr, leaverPeer.Addr)
	}
	if len(f.unary) != 0 || len(f.batches) != 1 || len(f.batches[0]) != 1 || f.batches[0][0].GetAcquire().GetResource() != "stays" {
		t.Fatalf("sent %v alone and batches %v; want only the write that stayed, as a request of one", f.unary, f.batchSizes())
	}
}

// A caller whose context ends while its batch is on its way returns at once; its write may have reached
// the node, so its peer says so (outcome unknown). The others in the batch get their answers.
func TestAWriteLeftInFlightMayHaveBeenSent(t *testing.T) {
	f := &fakeLeases{release: make(chan struct{}), started: make(chan struct{}, 1)}
	b := gatedBatcher(t, f, 2)
	leaving, cancel := context.WithCancel(context.Background())
	var leaverPeer peer.Peer
	var leaverErr, stayerErr error
	var wg sync.WaitGroup
	wg.Go(func() { _, stayerErr = b.acquire(context.Background(), &leasepb.AcquireRequest{Resource: "stays"}) })
	leaverReturned := make(chan struct{})
	wg.Go(func() {
		_, leaverErr = b.acquire(leaving, &leasepb.AcquireRequest{Resource: "leaves"}, grpc.Peer(&leaverPeer))
		close(leaverReturned)
	})
	<-f.started // the batch reached the node
	cancel()
	<-leaverReturned // while the batch is still held at the node
	close(f.release)
	wg.Wait()
	if status.Code(leaverErr) != codes.Canceled || leaverPeer.Addr == nil {
		t.Fatalf("the leaver got %v with peer %v; want Canceled, maybe sent", leaverErr, leaverPeer.Addr)
	}
	if stayerErr != nil {
		t.Fatalf("the write that stayed: %v", stayerErr)
	}
}

// Each write carries its own caller's deadline to the node.
func TestEachWriteCarriesItsCallersDeadline(t *testing.T) {
	f := &fakeLeases{}
	b := gatedBatcher(t, f, 2)
	short, cancel1 := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel1()
	long, cancel2 := context.WithTimeout(context.Background(), 9*time.Second)
	defer cancel2()
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = b.acquire(short, &leasepb.AcquireRequest{Resource: "short"}) })
	wg.Go(func() { _, _ = b.acquire(long, &leasepb.AcquireRequest{Resource: "long"}) })
	wg.Wait()
	if len(f.batches) != 1 {
		t.Fatalf("batches %v, want one", f.batchSizes())
	}
	for _, w := range f.batches[0] {
		ms := w.GetTimeoutMs()
		want := map[string][2]uint32{"short": {1000, 2000}, "long": {8000, 9000}}[w.GetAcquire().GetResource()]
		if ms < want[0] || ms > want[1] {
			t.Errorf("%s: timeout_ms %d, want within %v", w.GetAcquire().GetResource(), ms, want)
		}
	}
}

// A request that fails as a whole fails every write in it, with the node it reached.
func TestABatchThatFailsFailsEachWrite(t *testing.T) {
	f := &fakeLeases{batchErr: status.Error(codes.Unavailable, "connection reset")}
	b := gatedBatcher(t, f, 2)
	_, errs, peers := acquireAll(context.Background(), b, []string{"a", "bb"})
	for i, err := range errs {
		if status.Code(err) != codes.Unavailable || peers[i].Addr != fakeNode {
			t.Fatalf("write %d: %v (peer %v), want the batch's Unavailable with its peer", i, err, peers[i].Addr)
		}
	}
}

func (b *batcher) formingLen() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.forming == nil {
		return 0
	}
	return len(b.forming.calls)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
