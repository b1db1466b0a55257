package client_test

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
)

// viaUnary serves a fake's Writes stream by running each write through the fake's own unary method, as
// a node runs each write of a request as its own call, so that a fake need only answer Acquire, Renew
// and Release.
type viaUnary struct{ leasepb.LeasesServer }

func (v viaUnary) Writes(st grpc.BidiStreamingServer[leasepb.WritesRequest, leasepb.WritesResponse]) error {
	var sendMu sync.Mutex
	var running sync.WaitGroup
	defer running.Wait()
	for {
		req, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		running.Go(func() {
			resp := &leasepb.WritesResponse{Id: req.GetId(), Results: make([]*leasepb.BatchResult, len(req.GetWrites()))}
			for i, w := range req.GetWrites() {
				resp.Results[i] = v.run(st.Context(), w)
			}
			sendMu.Lock()
			defer sendMu.Unlock()
			_ = st.Send(resp)
		})
	}
}

// run runs one write through the fake's unary method, bounded by its timeout.
func (v viaUnary) run(ctx context.Context, w *leasepb.BatchWrite) *leasepb.BatchResult {
	if ms := w.GetTimeoutMs(); ms > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(ms)*time.Millisecond)
		defer cancel()
	}
	var res *leasepb.BatchResult
	var err error
	switch op := w.GetWrite().(type) {
	case *leasepb.BatchWrite_Acquire:
		var r *leasepb.AcquireResponse
		r, err = v.Acquire(ctx, op.Acquire)
		res = &leasepb.BatchResult{Result: &leasepb.BatchResult_Acquire{Acquire: r}}
	case *leasepb.BatchWrite_Renew:
		var r *leasepb.RenewResponse
		r, err = v.Renew(ctx, op.Renew)
		res = &leasepb.BatchResult{Result: &leasepb.BatchResult_Renew{Renew: r}}
	case *leasepb.BatchWrite_Release:
		var r *leasepb.ReleaseResponse
		r, err = v.Release(ctx, op.Release)
		res = &leasepb.BatchResult{Result: &leasepb.BatchResult_Release{Release: r}}
	}
	if err != nil {
		return &leasepb.BatchResult{Result: &leasepb.BatchResult_Error{Error: status.Convert(err).Proto()}}
	}
	return res
}
