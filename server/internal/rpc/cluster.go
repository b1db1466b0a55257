package rpc

import (
	"context"

	"github.com/leased/leased/api/leasepb"
)

// clusterService is the gRPC Cluster service: status, membership (internal/membership) and snapshots
// (snapshot.go).
type clusterService struct {
	leasepb.UnimplementedClusterServer
	o         *LeaseOps
	snapshots snapshotLimiter
}

// Status answers the node's status (Parts.Status) with this node's header and live leases.
func (s *clusterService) Status(ctx context.Context, _ *leasepb.StatusRequest) (*leasepb.StatusResponse, error) {
	resp := s.o.nodeStatus()
	resp.Header = s.o.header()
	resp.LiveLeases = uint64(s.o.LiveLeases())
	return resp, nil
}

// MemberList answers the member table: linearizably (after a ReadIndex round) unless serializable.
func (s *clusterService) MemberList(ctx context.Context, req *leasepb.MemberListRequest) (*leasepb.MemberListResponse, error) {
	o := s.o
	if !req.GetSerializable() {
		if err := o.Linearizable(ctx); err != nil {
			return nil, o.Status(err)
		}
	}
	return &leasepb.MemberListResponse{Header: o.header(), Members: o.members.Table()}, nil
}

// MemberAdd adds a learner; the leader promotes it once it has caught up (internal/membership/promote.go).
func (s *clusterService) MemberAdd(ctx context.Context, req *leasepb.MemberAddRequest) (*leasepb.MemberAddResponse, error) {
	o := s.o
	m, err := o.members.Add(ctx, req.GetName(), req.GetPeerAddr(), req.GetClientAddr())
	if err != nil {
		return nil, o.Status(err)
	}
	return &leasepb.MemberAddResponse{Header: o.header(), Member: m, Members: o.members.Table()}, nil
}

func (s *clusterService) MemberPromote(ctx context.Context, req *leasepb.MemberPromoteRequest) (*leasepb.MemberPromoteResponse, error) {
	o := s.o
	if err := o.members.Promote(ctx, req.GetId()); err != nil {
		return nil, o.Status(err)
	}
	return &leasepb.MemberPromoteResponse{Header: o.header(), Members: o.members.Table()}, nil
}

func (s *clusterService) MemberRemove(ctx context.Context, req *leasepb.MemberRemoveRequest) (*leasepb.MemberRemoveResponse, error) {
	o := s.o
	if err := o.members.Remove(ctx, req.GetId()); err != nil {
		return nil, o.Status(err)
	}
	return &leasepb.MemberRemoveResponse{Header: o.header(), Members: o.members.Table()}, nil
}
