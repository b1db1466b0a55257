package rpc

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
)

// MaxBatchWrites is the most writes one Writes request carries (leases.proto). It is part of the API
// rather than a flag, so that a client never has to learn a node's value before it batches.
const MaxBatchWrites = 64

// A batch is the writes of one Writes request (writes.go). Each runs as its own call would run
// (LeaseOps.Write: validated, authorized, forwarded to the leader if need be, answered with its own response
// or status), all at once, answered in order. Nothing is shared between the writes but the request: the
// point is to pay for one message instead of one gRPC call per write, on both sides, when a client has
// several quick writes ready at the same moment.

// admitBatch checks a batch against its limits and counts extra of its writes against the connection's
// calls (--max-streams-per-conn); the returned func gives them back.
func (s *LeasesService) admitBatch(ctx context.Context, writes []*leasepb.BatchWrite, extra int) (leave func(), err error) {
	if err := checkBatch(writes); err != nil {
		s.o.metrics.refused()
		return nil, err
	}
	leave, err = enterCalls(ctx, extra, s.o.cfg.Limits.MaxStreamsPerConn)
	if err != nil {
		s.o.metrics.refused()
		return nil, err
	}
	s.o.metrics.batchSize.Observe(float64(len(writes)))
	return leave, nil
}

// RunBatch runs the writes of a batch received at received, all at once, and returns their results in
// order.
func (s *LeasesService) RunBatch(ctx context.Context, received time.Time, writes []*leasepb.BatchWrite) []*leasepb.BatchResult {
	results := make([]*leasepb.BatchResult, len(writes))
	var wg sync.WaitGroup
	for i, w := range writes[1:] {
		wg.Go(func() { results[i+1] = s.batchWrite(ctx, received, w) })
	}
	results[0] = s.batchWrite(ctx, received, writes[0]) // on the caller's own goroutine: one goroutine fewer
	wg.Wait()
	return results
}

// checkBatch refuses a batch that breaks the call's own limits; each write's fields are checked where they
// run (serveWrite), as for its own call.
func checkBatch(writes []*leasepb.BatchWrite) error {
	if len(writes) == 0 || len(writes) > MaxBatchWrites {
		return invalid("writes", "carries %d writes; a batch carries 1 to %d", len(writes), MaxBatchWrites)
	}
	for i, w := range writes {
		switch op := w.GetWrite().(type) {
		case *leasepb.BatchWrite_Acquire:
			if op.Acquire.GetWait() {
				return invalid(fmt.Sprintf("writes[%d].acquire.wait", i), "an acquire that waits cannot be batched; call Acquire")
			}
		case *leasepb.BatchWrite_Renew, *leasepb.BatchWrite_Release:
		default:
			return invalid(fmt.Sprintf("writes[%d]", i), "is not an acquire, renew or release")
		}
	}
	return nil
}

// batchWrite runs one write of a batch, bounded by its own timeout.
func (s *LeasesService) batchWrite(ctx context.Context, received time.Time, w *leasepb.BatchWrite) *leasepb.BatchResult {
	if ms := w.GetTimeoutMs(); ms > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, received.Add(time.Duration(ms)*time.Millisecond))
		defer cancel()
	}
	var fwd *wirepb.ForwardRequest
	switch op := w.GetWrite().(type) {
	case *leasepb.BatchWrite_Acquire:
		fwd = &wirepb.ForwardRequest{Request: &wirepb.ForwardRequest_Acquire{Acquire: op.Acquire}}
	case *leasepb.BatchWrite_Renew:
		fwd = &wirepb.ForwardRequest{Request: &wirepb.ForwardRequest_Renew{Renew: op.Renew}}
	case *leasepb.BatchWrite_Release:
		fwd = &wirepb.ForwardRequest{Request: &wirepb.ForwardRequest_Release{Release: op.Release}}
	}
	resp, err := s.o.Write(ctx, fwd)
	if err != nil {
		return &leasepb.BatchResult{Result: &leasepb.BatchResult_Error{Error: status.Convert(err).Proto()}}
	}
	switch r := resp.GetResponse().(type) {
	case *wirepb.ForwardResponse_Acquire:
		return &leasepb.BatchResult{Result: &leasepb.BatchResult_Acquire{Acquire: r.Acquire}}
	case *wirepb.ForwardResponse_Renew:
		return &leasepb.BatchResult{Result: &leasepb.BatchResult_Renew{Renew: r.Renew}}
	case *wirepb.ForwardResponse_Release:
		return &leasepb.BatchResult{Result: &leasepb.BatchResult_Release{Release: r.Release}}
	}
	return &leasepb.BatchResult{Result: &leasepb.BatchResult_Error{Error: status.New(codes.Internal, "the write was answered with another kind of response").Proto()}}
}
