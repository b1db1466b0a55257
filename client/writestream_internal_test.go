package client

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
)

// streamNode is a gRPC server whose Writes streams run serve. Its unary Acquire grants every resource.
type streamNode struct {
	leasepb.UnimplementedLeasesServer
	serve   func(st grpc.BidiStreamingServer[leasepb.WritesRequest, leasepb.WritesResponse]) error
	streams atomic.Int32 // Writes streams opened
	unary   atomic.Int32 // Acquire calls
}

func (n *streamNode) Writes(st grpc.BidiStreamingServer[leasepb.WritesRequest, leasepb.WritesResponse]) error {
	n.streams.Add(1)
	return n.serve(st)
}

func (n *streamNode) Acquire(_ context.Context, req *leasepb.AcquireRequest) (*leasepb.AcquireResponse, error) {
	n.unary.Add(1)
	return grant(req)
}

// answer is the node's answer to req: each acquire granted (grant), under the request's id.
func answer(req *leasepb.WritesRequest) *leasepb.WritesResponse {
	resp := &leasepb.WritesResponse{Id: req.GetId()}
	for _, w := range req.GetWrites() {
		r, err := grant(w.GetAcquire())
		res := &leasepb.BatchResult{Result: &leasepb.BatchResult_Acquire{Acquire: r}}
		if err != nil {
			res = &leasepb.BatchResult{Result: &leasepb.BatchResult_Error{Error: status.Convert(err).Proto()}}
		}
		resp.Results = append(resp.Results, res)
	}
	return resp
}

// startStreamNode serves n on 127.0.0.1 and returns a batcher on a connection to it, closed with the test.
func startStreamNode(t *testing.T, n *streamNode) *batcher {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	leasepb.RegisterLeasesServer(srv, n)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(lis)
	}()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b := newBatcher(ctx, conn, lis.Addr().String(), false, nil)
	b.yield = func() {}
	t.Cleanup(func() {
		cancel()
		b.close()
		_ = conn.Close()
		srv.Stop()
		<-served
	})
	return b
}

func acquireOne(t *testing.T, b *batcher, resource string) (*leasepb.AcquireResponse, peer.Peer, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var p peer.Peer
	resp, err := b.acquire(ctx, &leasepb.AcquireRequest{Resource: resource}, grpc.Peer(&p))
	return resp, p, err
}

// Answers come back in any order; each caller gets its own, and a write alone goes on the stream too.
func TestStreamAnswersReachTheirOwnCallers(t *testing.T) {
	n := &streamNode{serve: func(st grpc.BidiStreamingServer[leasepb.WritesRequest, leasepb.WritesResponse]) error {
		first, err := st.Recv()
		if err != nil {
			return err
		}
		second, err := st.Recv()
		if err != nil {
			return err
		}
		for _, req := range []*leasepb.WritesRequest{second, first} { // the later one first
			if err := st.Send(answer(req)); err != nil {
				return err
			}
		}
		for {
			req, err := st.Recv()
			if err != nil {
				return nil
			}
			if err := st.Send(answer(req)); err != nil {
				return err
			}
		}
	}}
	b := startStreamNode(t, n)
	resources := []string{"a", "bb"}
	resps, errs, peers := make([]*leasepb.AcquireResponse, 2), make([]error, 2), make([]peer.Peer, 2)
	var wg sync.WaitGroup
	for i, r := range resources {
		wg.Go(func() { resps[i], peers[i], errs[i] = acquireOne(t, b, r) })
	}
	wg.Wait()
	for i, r := range resources {
		if errs[i] != nil || resps[i].GetLease().GetResource() != r || peers[i].Addr == nil {
			t.Errorf("%s: %v, %v (peer %v); want its own grant from the node", r, resps[i], errs[i], peers[i].Addr)
		}
	}
	if _, _, err := acquireOne(t, b, "held"); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("a refused write: %v, want its own FailedPrecondition", err)
	}
	if n.streams.Load() != 1 || n.unary.Load() != 0 {
		t.Fatalf("%d streams and %d calls of their own; want every write on one stream", n.streams.Load(), n.unary.Load())
	}
}

// A draining node still answers what it received; the client closes its side, and the next write opens
// another stream.
func TestStreamOfADrainingNodeIsClosedAndReplaced(t *testing.T) {
	var sawEOF atomic.Bool
	n := &streamNode{}
	n.serve = func(st grpc.BidiStreamingServer[leasepb.WritesRequest, leasepb.WritesResponse]) error {
		req, err := st.Recv()
		if err != nil {
			return err
		}
		if n.streams.Load() == 1 { // the first stream drains with the request in hand
			if err := st.Send(&leasepb.WritesResponse{Draining: true}); err != nil {
				return err
			}
			if _, err := st.Recv(); errors.Is(err, io.EOF) {
				sawEOF.Store(true)
			}
			return st.Send(answer(req))
		}
		return st.Send(answer(req))
	}
	b := startStreamNode(t, n)
	for _, r := range []string{"during", "after"} {
		if resp, _, err := acquireOne(t, b, r); err != nil || resp.GetLease().GetResource() != r {
			t.Fatalf("%s the drain: %v, %v", r, resp, err)
		}
	}
	if !sawEOF.Load() || n.streams.Load() != 2 {
		t.Fatalf("client closed its side: %v; %d streams, want the drained one and another", sawEOF.Load(), n.streams.Load())
	}
}

// A stream that breaks with a request unanswered fails its writes as a broken call would: Unavailable, the
// request possibly delivered (the peer is set, so the SDK treats the outcome as unknown). The next write
// opens another stream.
func TestStreamThatBreaksFailsItsWritesAsMaybeSent(t *testing.T) {
	n := &streamNode{}
	n.serve = func(st grpc.BidiStreamingServer[leasepb.WritesRequest, leasepb.WritesResponse]) error {
		req, err := st.Recv()
		if err != nil {
			return err
		}
		if n.streams.Load() == 1 {
			return status.Error(codes.Unavailable, "injected: the node went away")
		}
		return st.Send(answer(req))
	}
	b := startStreamNode(t, n)
	_, p, err := acquireOne(t, b, "lost")
	if status.Code(err) != codes.Unavailable || p.Addr == nil {
		t.Fatalf("a write on a broken stream: %v (peer %v); want Unavailable, maybe sent", err, p.Addr)
	}
	if resp, _, err := acquireOne(t, b, "next"); err != nil || resp.GetLease().GetResource() != "next" || n.streams.Load() != 2 {
		t.Fatalf("the next write: %v, %v on %d streams; want granted on a new stream", resp, err, n.streams.Load())
	}
}

// A node that stops reading (frozen) fills the stream's window and blocks Send: the wait ends with the
// batch's deadline, by ending the stream, and the next write opens another.
func TestStreamToANodeThatStopsReadingEndsAtTheDeadline(t *testing.T) {
	n := &streamNode{}
	n.serve = func(st grpc.BidiStreamingServer[leasepb.WritesRequest, leasepb.WritesResponse]) error {
		if n.streams.Load() == 1 {
			<-st.Context().Done() // frozen: reads nothing
			return nil
		}
		req, err := st.Recv()
		if err != nil {
			return err
		}
		return st.Send(answer(req))
	}
	b := startStreamNode(t, n)
	big := make([]byte, 1<<20) // each write larger than the stream's flow-control window
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			if _, err := b.acquire(ctx, &leasepb.AcquireRequest{Resource: "frozen", Value: big}); err == nil {
				t.Error("a write to a node that reads nothing succeeded")
			}
		})
	}
	wg.Wait()
	if resp, _, err := acquireOne(t, b, "next"); err != nil || resp.GetLease().GetResource() != "next" || n.streams.Load() != 2 {
		t.Fatalf("the next write: %v, %v on %d streams; want granted on a new stream", resp, err, n.streams.Load())
	}
}
