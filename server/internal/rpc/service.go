package rpc

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/server/internal/auth"
	"github.com/leased/leased/server/internal/watch"
)

// LeasesService is the gRPC Leases service: a thin adapter over LeaseOps. Writes go through its Write
// (forward.go), which validates them, runs them here or on the leader (one hop) and stamps the answer;
// reads are validated here and served by any node (leases.go).
type LeasesService struct {
	leasepb.UnimplementedLeasesServer
	o *LeaseOps
}

func (s *LeasesService) Acquire(ctx context.Context, req *leasepb.AcquireRequest) (*leasepb.AcquireResponse, error) {
	resp, err := s.o.Write(ctx, &wirepb.ForwardRequest{Request: &wirepb.ForwardRequest_Acquire{Acquire: req}})
	return resp.GetAcquire(), err
}

func (s *LeasesService) Renew(ctx context.Context, req *leasepb.RenewRequest) (*leasepb.RenewResponse, error) {
	resp, err := s.o.Write(ctx, &wirepb.ForwardRequest{Request: &wirepb.ForwardRequest_Renew{Renew: req}})
	return resp.GetRenew(), err
}

func (s *LeasesService) Release(ctx context.Context, req *leasepb.ReleaseRequest) (*leasepb.ReleaseResponse, error) {
	resp, err := s.o.Write(ctx, &wirepb.ForwardRequest{Request: &wirepb.ForwardRequest_Release{Release: req}})
	return resp.GetRelease(), err
}

// KeepAlive serves each message of the stream as one write (a batch of renewals).
func (s *LeasesService) KeepAlive(stream grpc.BidiStreamingServer[leasepb.KeepAliveRequest, leasepb.KeepAliveResponse]) error {
	defer s.o.metrics.stream(streamKeepAlive)()
	ctx := stream.Context()
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		resp, err := s.o.Write(ctx, &wirepb.ForwardRequest{Request: &wirepb.ForwardRequest_KeepAlive{KeepAlive: req}})
		if err != nil {
			return err
		}
		if err := stream.Send(resp.GetKeepAlive()); err != nil {
			return err
		}
	}
}

func (s *LeasesService) Proclaim(ctx context.Context, req *leasepb.ProclaimRequest) (*leasepb.ProclaimResponse, error) {
	resp, err := s.o.Write(ctx, &wirepb.ForwardRequest{Request: &wirepb.ForwardRequest_Proclaim{Proclaim: req}})
	return resp.GetProclaim(), err
}

func (s *LeasesService) Get(ctx context.Context, req *leasepb.GetRequest) (*leasepb.GetResponse, error) {
	if err := s.o.cfg.Limits.resource("resource", req.GetResource()); err != nil {
		return nil, s.o.Status(err)
	}
	id, err := s.o.authz.Identity(ctx)
	if err != nil {
		return nil, s.o.Status(err)
	}
	resp, err := s.o.get(ctx, req, id)
	if err != nil {
		return nil, s.o.Status(err)
	}
	applied := resp.GetHeader().GetAppliedIndex() // the index of the state get read, not a later one
	resp.Header = s.o.header()
	resp.Header.AppliedIndex = applied
	return resp, nil
}

func (s *LeasesService) List(ctx context.Context, req *leasepb.ListRequest) (*leasepb.ListResponse, error) {
	if err := s.o.cfg.Limits.list(req); err != nil {
		return nil, s.o.Status(err)
	}
	id, err := s.o.authz.Identity(ctx)
	if err != nil {
		return nil, s.o.Status(err)
	}
	resp, err := s.o.list(ctx, req, id)
	if err != nil {
		return nil, s.o.Status(err)
	}
	resp.Header = s.o.header()
	return resp, nil
}

func (s *LeasesService) ValidateToken(ctx context.Context, req *leasepb.ValidateTokenRequest) (*leasepb.ValidateTokenResponse, error) {
	if err := s.o.cfg.Limits.leaseRef(req.GetResource(), req.GetToken()); err != nil {
		return nil, s.o.Status(err)
	}
	id, err := s.o.authz.Identity(ctx)
	if err != nil {
		return nil, s.o.Status(err)
	}
	resp, err := s.o.validateToken(ctx, req, id)
	if err != nil {
		return nil, s.o.Status(err)
	}
	resp.Header = s.o.header()
	return resp, nil
}

// Watch streams the events a watcher matches from the node's history (internal/watch): each round reads the
// next events after the stream's cursor, without holding anything the apply loop needs, and sends them
// in messages of at most watchRoundBytes; between rounds it waits for the next publish. Subscriptions are
// bounded per connection (--max-watchers-per-conn), per identity (--max-watchers-per-identity, with client
// authentication) and per node (--max-watchers).
func (s *LeasesService) Watch(req *leasepb.WatchRequest, stream grpc.ServerStreamingServer[leasepb.WatchResponse]) error {
	defer s.o.metrics.stream(streamWatch)()
	if err := s.o.cfg.Limits.watch(req); err != nil {
		return s.o.Status(err)
	}
	id, err := s.o.authz.Identity(stream.Context())
	if err != nil {
		return s.o.Status(err)
	}
	scope := req.GetPrefix()
	if req.GetResource() != "" {
		scope = req.GetResource()
	}
	if err := s.o.authz.AuthorizeRead(id, scope); err != nil {
		return s.o.Status(err)
	}
	ctx := stream.Context()
	if cc := connOf(ctx); cc != nil {
		if !take(&cc.watchers, s.o.cfg.Limits.MaxWatchersPerConn) {
			return s.o.Status(limited("--max-watchers-per-conn", "this connection holds %d watchers, the most it may", s.o.cfg.Limits.MaxWatchersPerConn))
		}
		defer cc.watchers.Add(-1)
	}
	if id != "" {
		if limit := s.o.cfg.Limits.MaxWatchersPerIdentity; !s.o.watch.Identities.Take(id, limit) {
			return s.o.Status(limited("--max-watchers-per-identity", "identity %q holds %d watchers on this node, the most one identity may", id, limit))
		}
		defer s.o.watch.Identities.Put(id)
	}
	w, err := s.o.watch.Subscribe(req.GetFromIndex(), s.o.commit()+1, watch.Matcher(req.GetResource(), req.GetPrefix()))
	if err != nil {
		return s.o.Status(err)
	}
	defer s.o.watch.Unsubscribe(w)
	limit := min(watchMessageBytes(s.o.cfg.Limits), watchRoundBytes)
	last := w.From() - 1 // the index before the next event to send, for the resume hint
	for {
		events, err := s.o.watch.Read(w, int64(limit))
		if err != nil {
			return s.watchEnded(err, last)
		}
		if len(events) == 0 {
			if err := s.sleep(ctx, w); err != nil {
				return err
			}
			continue
		}
		for _, resp := range s.o.watchResponses(auth.VisibleEvents(events, id, s.o.cfg.ClientCertAuth), limit) {
			if err := stream.Send(resp); err != nil {
				return err
			}
		}
		last = events[len(events)-1].Index
	}
}

// sleep waits until the hub's notifier has events for w, the stream ends, or the node stops serving.
func (s *LeasesService) sleep(ctx context.Context, w *watch.Watcher) error {
	wake, leave := s.o.watch.Sleep(w)
	defer leave()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-s.o.done: // stopped serving (a stalled disk): the watcher resumes on another node
		return s.o.Status(s.o.StoppedErr())
	case <-wake:
		return nil
	}
}

// watchEnded is the status a Watch stream ends with when its watcher's read fails.
func (s *LeasesService) watchEnded(err error, last uint64) error {
	if errors.Is(err, ErrStopped) {
		return s.o.Status(err)
	}
	return status.Errorf(codes.ResourceExhausted, "%v (--watch-history, --watch-history-bytes); resume with from_index %d", err, last+1)
}

// NewLeasesService is the gRPC Leases service of o.
func NewLeasesService(o *LeaseOps) *LeasesService { return &LeasesService{o: o} }

// NewClusterService is the gRPC Cluster service of o.
func NewClusterService(o *LeaseOps) leasepb.ClusterServer { return &clusterService{o: o} }
