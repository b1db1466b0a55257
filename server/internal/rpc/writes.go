package rpc

import (
	"errors"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
)

// Writes serves batches of quick writes (batch.go) over one long-lived stream. A unary call costs the client and the node
// tens of microseconds whatever it carries (its HTTP/2 stream, headers and trailers, the handler
// goroutine, the interceptors); a message on an open stream costs a fraction of that, and the difference
// is about a tenth of an acquire's time at one client (docs/benchmarks.md, "Writes over one stream").
//
// Each request runs as a batch (admitBatch, RunBatch) on a goroutine of its own, and is answered under its id when its writes are; the stream's own call counts one against
// --max-streams-per-conn and each request's writes one each while they run. When the node begins to shut
// down it tells the client (draining), which closes its side; the handler answers what it received and
// returns, so that the graceful stop ends without cutting a request off.
func (s *LeasesService) Writes(stream grpc.BidiStreamingServer[leasepb.WritesRequest, leasepb.WritesResponse]) error {
	defer s.o.metrics.stream(streamWrites)()
	ctx := stream.Context()
	out := &writesSender{stream: stream}
	var running sync.WaitGroup
	defer running.Wait() // no answer is sent after the handler returns
	notified := make(chan struct{})
	defer close(notified)
	running.Go(func() { out.noticeDrain(s.o.draining, notified) })
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil // the client closed its side: the deferred Wait answers what is running first
		}
		if err != nil {
			return err
		}
		received := time.Now()
		leave, err := s.admitBatch(ctx, req.GetWrites(), len(req.GetWrites()))
		if err != nil {
			out.send(&leasepb.WritesResponse{Id: req.GetId(), Error: status.Convert(s.o.Status(err)).Proto()})
			continue
		}
		running.Go(func() {
			defer leave()
			out.send(&leasepb.WritesResponse{Id: req.GetId(), Results: s.RunBatch(ctx, received, req.GetWrites())})
		})
	}
}

// writesSender serializes a Writes stream's answers: gRPC allows one Send at a time.
type writesSender struct {
	mu     sync.Mutex
	stream grpc.BidiStreamingServer[leasepb.WritesRequest, leasepb.WritesResponse]
}

// send sends one answer. A failed Send means the stream is gone; the handler's Recv learns it too.
func (w *writesSender) send(resp *leasepb.WritesResponse) {
	w.mu.Lock()
	defer w.mu.Unlock()
	_ = w.stream.Send(resp)
}

// noticeDrain tells the client when the node begins to shut down (draining closes), unless the handler
// returns first (done closes).
func (w *writesSender) noticeDrain(draining, done <-chan struct{}) {
	select {
	case <-draining:
		w.send(&leasepb.WritesResponse{Draining: true})
	case <-done:
	}
}
