package server

import (
	"context"
	"errors"
	"io"

	"go.etcd.io/raft/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/fsm"
)

// leasesService is the gRPC Leases service. It validates every request at the edge (nothing invalid is
// proposed), forwards writes that reach a follower to the leader (one hop), and stamps every answer with
// the leader it knows of.
type leasesService struct {
	leasepb.UnimplementedLeasesServer
	n *node
}

func (s *leasesService) Acquire(ctx context.Context, req *leasepb.AcquireRequest) (*leasepb.AcquireResponse, error) {
	if err := s.n.cfg.Limits.acquire(req); err != nil {
		return nil, s.n.status(err)
	}
	if !s.n.isLeader() {
		resp, err := s.n.forward(ctx, &leasepb.ForwardRequest{Request: &leasepb.ForwardRequest_Acquire{Acquire: req}})
		return resp.GetAcquire(), err
	}
	resp, err := s.n.acquire(ctx, req)
	if err != nil {
		return nil, s.n.status(err)
	}
	resp.Header = s.n.header()
	return resp, nil
}

func (s *leasesService) Renew(ctx context.Context, req *leasepb.RenewRequest) (*leasepb.RenewResponse, error) {
	if err := s.n.cfg.Limits.leaseRef(req.GetResource(), req.GetToken()); err != nil {
		return nil, s.n.status(err)
	}
	if !s.n.isLeader() {
		resp, err := s.n.forward(ctx, &leasepb.ForwardRequest{Request: &leasepb.ForwardRequest_Renew{Renew: req}})
		return resp.GetRenew(), err
	}
	resp, err := s.n.renewOne(ctx, req)
	return resp, s.n.status(err)
}

func (n *node) renewOne(ctx context.Context, req *leasepb.RenewRequest) (*leasepb.RenewResponse, error) {
	results, err := n.renewAll(ctx, []*leasepb.LeaseRef{{Resource: req.GetResource(), Token: req.GetToken()}})
	if err != nil {
		return nil, err
	}
	if results[0].GetGone() {
		return nil, ErrNotCurrent
	}
	return &leasepb.RenewResponse{Header: n.header(), TtlMs: results[0].GetTtlMs()}, nil
}

func (s *leasesService) KeepAlive(stream grpc.BidiStreamingServer[leasepb.KeepAliveRequest, leasepb.KeepAliveResponse]) error {
	ctx := stream.Context()
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := s.n.cfg.Limits.keepAlive(req); err != nil {
			return s.n.status(err)
		}
		resp, err := s.n.keepAlive(ctx, req)
		if err != nil {
			return s.n.status(err)
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

// keepAlive renews one KeepAlive message's leases, here or on the leader.
func (n *node) keepAlive(ctx context.Context, req *leasepb.KeepAliveRequest) (*leasepb.KeepAliveResponse, error) {
	if !n.isLeader() {
		resp, err := n.forward(ctx, &leasepb.ForwardRequest{Request: &leasepb.ForwardRequest_KeepAlive{KeepAlive: req}})
		return resp.GetKeepAlive(), err
	}
	results, err := n.renewAll(ctx, req.GetLeases())
	if err != nil {
		return nil, err
	}
	return &leasepb.KeepAliveResponse{Header: n.header(), Seq: req.GetSeq(), Results: results}, nil
}

func (s *leasesService) Release(ctx context.Context, req *leasepb.ReleaseRequest) (*leasepb.ReleaseResponse, error) {
	if err := s.n.cfg.Limits.leaseRef(req.GetResource(), req.GetToken()); err != nil {
		return nil, s.n.status(err)
	}
	if !s.n.isLeader() {
		resp, err := s.n.forward(ctx, &leasepb.ForwardRequest{Request: &leasepb.ForwardRequest_Release{Release: req}})
		return resp.GetRelease(), err
	}
	resp, err := s.n.release(ctx, req)
	if err != nil {
		return nil, s.n.status(err)
	}
	resp.Header = s.n.header()
	return resp, nil
}

func (s *leasesService) Get(ctx context.Context, req *leasepb.GetRequest) (*leasepb.GetResponse, error) {
	if err := s.n.cfg.Limits.resource("resource", req.GetResource()); err != nil {
		return nil, s.n.status(err)
	}
	resp, err := s.n.get(ctx, req)
	if err != nil {
		return nil, s.n.status(err)
	}
	resp.Header = s.n.header()
	return resp, nil
}

func (s *leasesService) List(ctx context.Context, req *leasepb.ListRequest) (*leasepb.ListResponse, error) {
	if err := s.n.cfg.Limits.list(req); err != nil {
		return nil, s.n.status(err)
	}
	resp, err := s.n.list(ctx, req)
	if err != nil {
		return nil, s.n.status(err)
	}
	resp.Header = s.n.header()
	return resp, nil
}

func (s *leasesService) ValidateToken(ctx context.Context, req *leasepb.ValidateTokenRequest) (*leasepb.ValidateTokenResponse, error) {
	if err := s.n.cfg.Limits.leaseRef(req.GetResource(), req.GetToken()); err != nil {
		return nil, s.n.status(err)
	}
	resp, err := s.n.validateToken(ctx, req)
	if err != nil {
		return nil, s.n.status(err)
	}
	resp.Header = s.n.header()
	return resp, nil
}

func (s *leasesService) Watch(req *leasepb.WatchRequest, stream grpc.ServerStreamingServer[leasepb.WatchResponse]) error {
	if err := s.n.cfg.Limits.watch(req); err != nil {
		return s.n.status(err)
	}
	w, backlog, err := s.n.watch.subscribe(req.GetFromIndex(), s.n.commit.Load()+1, matcher(req.GetResource(), req.GetPrefix()))
	if err != nil {
		return s.n.status(err)
	}
	defer s.n.watch.unsubscribe(w)
	const chunk = 512
	for len(backlog) > 0 {
		k := min(chunk, len(backlog))
		if err := stream.Send(s.n.watchResponse(backlog[:k])); err != nil {
			return err
		}
		backlog = backlog[k:]
	}
	last := uint64(0)
	for {
		select {
		case <-stream.Context().Done():
			return stream.Context().Err()
		case events, ok := <-w.ch:
			if !ok {
				return status.Errorf(codes.ResourceExhausted, "watch fell behind or the node reset its history; resume with from_index %d", last+1)
			}
			if err := stream.Send(s.n.watchResponse(events)); err != nil {
				return err
			}
			last = events[len(events)-1].Index
		}
	}
}

func (n *node) watchResponse(events []fsm.Event) *leasepb.WatchResponse {
	resp := &leasepb.WatchResponse{Header: n.header(), Events: make([]*leasepb.Event, len(events))}
	for i, e := range events {
		resp.Events[i] = e.Proto()
	}
	return resp
}

// forward sends a write to the leader over the peer connection and relays its answer (or its status).
func (n *node) forward(ctx context.Context, req *leasepb.ForwardRequest) (*leasepb.ForwardResponse, error) {
	leader := n.leader.Load()
	if leader == raft.None || leader == n.id {
		return nil, n.status(n.notLeaderErr())
	}
	client, ok := n.transport.PeerClient(leader)
	if !ok {
		return nil, n.status(ErrNoLeader)
	}
	req.ClusterId, req.From = n.clusterID, n.id
	resp, err := client.Forward(ctx, req)
	if err != nil {
		if st, ok := status.FromError(err); ok && st.Code() != codes.Unknown {
			return nil, err
		}
		return nil, n.status(ErrNoLeader)
	}
	n.learnLeaderAddr(resp)
	return resp, nil
}

// serveForward runs a follower's forwarded request, validated exactly as a direct one. It never forwards
// again: a node that is not the leader answers Unavailable and the follower's client retries.
func (n *node) serveForward(ctx context.Context, req *leasepb.ForwardRequest) (*leasepb.ForwardResponse, error) {
	if err := n.cfg.Limits.write(req); err != nil {
		return nil, n.status(err)
	}
	if !n.isLeader() {
		return nil, n.status(n.notLeaderErr())
	}
	var (
		resp *leasepb.ForwardResponse
		err  error
	)
	switch r := req.GetRequest().(type) {
	case *leasepb.ForwardRequest_Acquire:
		var a *leasepb.AcquireResponse
		if a, err = n.acquire(ctx, r.Acquire); err == nil {
			a.Header = n.header()
			resp = &leasepb.ForwardResponse{Response: &leasepb.ForwardResponse_Acquire{Acquire: a}}
		}
	case *leasepb.ForwardRequest_Renew:
		var a *leasepb.RenewResponse
		if a, err = n.renewOne(ctx, r.Renew); err == nil {
			resp = &leasepb.ForwardResponse{Response: &leasepb.ForwardResponse_Renew{Renew: a}}
		}
	case *leasepb.ForwardRequest_Release:
		var a *leasepb.ReleaseResponse
		if a, err = n.release(ctx, r.Release); err == nil {
			a.Header = n.header()
			resp = &leasepb.ForwardResponse{Response: &leasepb.ForwardResponse_Release{Release: a}}
		}
	case *leasepb.ForwardRequest_KeepAlive:
		var a *leasepb.KeepAliveResponse
		if a, err = n.keepAlive(ctx, r.KeepAlive); err == nil {
			resp = &leasepb.ForwardResponse{Response: &leasepb.ForwardResponse_KeepAlive{KeepAlive: a}}
		}
	default:
		err = invalid("request", "unknown forwarded request")
	}
	return resp, n.status(err)
}

// learnLeaderAddr remembers the leader's client address from a forwarded answer, for leader hints.
func (n *node) learnLeaderAddr(resp *leasepb.ForwardResponse) {
	var h *leasepb.ResponseHeader
	switch r := resp.GetResponse().(type) {
	case *leasepb.ForwardResponse_Acquire:
		h = r.Acquire.GetHeader()
	case *leasepb.ForwardResponse_Renew:
		h = r.Renew.GetHeader()
	case *leasepb.ForwardResponse_Release:
		h = r.Release.GetHeader()
	case *leasepb.ForwardResponse_KeepAlive:
		h = r.KeepAlive.GetHeader()
	}
	if h.GetLeaderId() != 0 && h.GetLeaderAddr() != "" {
		n.setClientAddr(h.GetLeaderId(), h.GetLeaderAddr())
	}
}

// header describes this node and the leader it knows of.
func (n *node) header() *leasepb.ResponseHeader {
	hint := n.hint()
	return &leasepb.ResponseHeader{
		ClusterId:    n.clusterID,
		MemberId:     n.id,
		LeaderId:     hint.id,
		LeaderAddr:   hint.addr,
		RaftTerm:     n.term.Load(),
		AppliedIndex: n.applied.Load(),
	}
}

func (n *node) hint() leaderHint {
	leader := n.leader.Load()
	return leaderHint{id: leader, addr: n.clientAddrOf(leader)}
}

// status maps an error to a gRPC status, attaching the leader hint.
func (n *node) status(err error) error { return toStatus(err, n.hint()) }
