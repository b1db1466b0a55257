package server

import (
	"context"
	"fmt"

	"go.etcd.io/raft/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
)

// One path for every write (Acquire, Renew, Release, KeepAlive, Proclaim). A write travels as a ForwardRequest,
// whichever node it reached: the gRPC handlers call write, the peer-port Forward RPC calls serveForward,
// and both go through serveWrite, which validates, then runs the write here if this node leads, or else
// forwards it to the leader once (a node serving a forwarded write never forwards it again). Validation,
// the response header and the error status are applied there and nowhere else.

// write serves a client's write: here if this node leads, else on the leader (one hop).
// The client's identity (authn.go) is decided here, by the node the client reached, and travels with the
// request to the leader.
func (n *node) write(ctx context.Context, req *wirepb.ForwardRequest) (*wirepb.ForwardResponse, error) {
	id, err := n.identityOf(ctx)
	if err != nil {
		return nil, n.status(err)
	}
	req.Identity = id
	return n.serveWrite(ctx, req, true)
}

// serveForward serves a write a follower forwarded. It never forwards again: a node that is not the
// leader answers Unavailable with its leader hint, and the follower's client retries.
func (n *node) serveForward(ctx context.Context, req *wirepb.ForwardRequest) (*wirepb.ForwardResponse, error) {
	return n.serveWrite(ctx, req, false)
}

// serveWrite validates req (with this node's limits: a leader never trusts a follower to have checked),
// then runs it here if this node leads, or forwards it to the leader if mayForward. Errors come back as
// gRPC statuses with the leader hint.
func (n *node) serveWrite(ctx context.Context, req *wirepb.ForwardRequest, mayForward bool) (*wirepb.ForwardResponse, error) {
	if err := n.cfg.Limits.write(req); err != nil {
		n.metrics.refused()
		return nil, n.status(err)
	}
	if n.cfg.ClientCertAuth && req.GetIdentity() == "" {
		// Forwarded by a peer that does not require client certificates: a misconfigured member.
		n.metrics.refused()
		return nil, n.status(unauthenticated("the write reached this node without a client identity (is --client-cert-auth set on every member?)"))
	}
	if !n.isLeader() {
		if !mayForward {
			n.metrics.refused()
			return nil, n.status(n.notLeaderErr())
		}
		return n.forward(ctx, req)
	}
	if err := n.authorizeWrite(req); err != nil {
		n.metrics.refused()
		return nil, n.status(err)
	}
	resp, err := n.runWrite(ctx, req)
	if err != nil {
		return nil, n.status(err)
	}
	setHeader(resp, n.header())
	return resp, nil
}

// runWrite runs a validated write on this node, the leader (leases.go).
func (n *node) runWrite(ctx context.Context, req *wirepb.ForwardRequest) (*wirepb.ForwardResponse, error) {
	switch r := req.GetRequest().(type) {
	case *wirepb.ForwardRequest_Acquire:
		a, err := n.acquire(ctx, r.Acquire, req.GetIdentity())
		return &wirepb.ForwardResponse{Response: &wirepb.ForwardResponse_Acquire{Acquire: a}}, err
	case *wirepb.ForwardRequest_Renew:
		a, err := n.renew(ctx, r.Renew)
		return &wirepb.ForwardResponse{Response: &wirepb.ForwardResponse_Renew{Renew: a}}, err
	case *wirepb.ForwardRequest_Release:
		a, err := n.release(ctx, r.Release, req.GetIdentity())
		return &wirepb.ForwardResponse{Response: &wirepb.ForwardResponse_Release{Release: a}}, err
	case *wirepb.ForwardRequest_KeepAlive:
		a, err := n.keepAlive(ctx, r.KeepAlive)
		return &wirepb.ForwardResponse{Response: &wirepb.ForwardResponse_KeepAlive{KeepAlive: a}}, err
	case *wirepb.ForwardRequest_Proclaim:
		a, err := n.proclaim(ctx, r.Proclaim, req.GetIdentity())
		return &wirepb.ForwardResponse{Response: &wirepb.ForwardResponse_Proclaim{Proclaim: a}}, err
	default:
		return nil, invalid("request", "not a write this node knows") // Limits.write refused it already
	}
}

// forward sends a write to the leader over the peer connection and relays its answer (or its status).
func (n *node) forward(ctx context.Context, req *wirepb.ForwardRequest) (*wirepb.ForwardResponse, error) {
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
		if st, ok := status.FromError(err); ok && st.Code() != codes.Unknown && (st.Code() != codes.Unavailable || hasLeaderHint(st)) {
			return nil, err // the leader's own answer (it says whether the outcome is known), or a deadline
		}
		// The peer call failed in transit: the leader may have run the write, so its outcome is unknown.
		return nil, n.status(unknownOutcome(fmt.Errorf("forward to the leader: %v: %w", err, ErrNoLeader)))
	}
	return resp, nil
}

// hasLeaderHint reports whether st carries a LeaderHint, as every Unavailable a node answers does.
func hasLeaderHint(st *status.Status) bool {
	for _, d := range st.Details() {
		if _, ok := d.(*leasepb.LeaderHint); ok {
			return true
		}
	}
	return false
}

// headerOf is the response header of a write's answer.
func headerOf(resp *wirepb.ForwardResponse) *leasepb.ResponseHeader {
	switch r := resp.GetResponse().(type) {
	case *wirepb.ForwardResponse_Acquire:
		return r.Acquire.GetHeader()
	case *wirepb.ForwardResponse_Renew:
		return r.Renew.GetHeader()
	case *wirepb.ForwardResponse_Release:
		return r.Release.GetHeader()
	case *wirepb.ForwardResponse_KeepAlive:
		return r.KeepAlive.GetHeader()
	case *wirepb.ForwardResponse_Proclaim:
		return r.Proclaim.GetHeader()
	}
	return nil
}

// setHeader stamps a write's answer with h.
func setHeader(resp *wirepb.ForwardResponse, h *leasepb.ResponseHeader) {
	switch r := resp.GetResponse().(type) {
	case *wirepb.ForwardResponse_Acquire:
		r.Acquire.Header = h
	case *wirepb.ForwardResponse_Renew:
		r.Renew.Header = h
	case *wirepb.ForwardResponse_Release:
		r.Release.Header = h
	case *wirepb.ForwardResponse_KeepAlive:
		r.KeepAlive.Header = h
	case *wirepb.ForwardResponse_Proclaim:
		r.Proclaim.Header = h
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
