package server

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/server/transport"
)

// A peer call speaks for one member only (decision 15). With peer TLS that member is the one the caller's
// certificate names (transport.Caller); without, there is no credential, so a Join that changes an
// address must give the cluster id and be confirmed by the member itself at its peer address in the member
// table, and a forwarded write carries no client identity at all (a follower with a plaintext peer port
// sends such writes' clients to the leader instead: forwardsIdentity).

// mayAnnounce checks that the asker of a Join may change member m's client address to addr: it is m.
func (mb *membership) mayAnnounce(ctx context.Context, req *wirepb.JoinRequest, m *leasepb.Member, addr string) error {
	if mb.cfg.PeerTLS != nil {
		if caller := transport.Caller(ctx); caller != m.GetId() {
			return status.Errorf(codes.PermissionDenied, "a Join may change only the caller's own member entry: "+
				"the caller's certificate names member %s, not %s (%s)", leasepb.FormatID(caller), leasepb.FormatID(m.GetId()), m.GetName())
		}
		return nil
	}
	if req.GetClusterId() != mb.clusterID {
		return status.Errorf(codes.PermissionDenied, "a Join that changes a member's client address must come from that member "+
			"and give its cluster id (%s is not this cluster)", leasepb.FormatID(req.GetClusterId()))
	}
	return mb.confirmClientAddr(ctx, m, addr)
}

// confirmClientAddr asks member m, at its peer address in the member table, whether addr is the client
// address it advertises: on a plaintext peer port, who reaches that address is the member.
func (mb *membership) confirmClientAddr(ctx context.Context, m *leasepb.Member, addr string) error {
	client, ok := mb.host.peerClient(m.GetId())
	if !ok {
		return status.Errorf(codes.Unavailable, "cannot reach member %s to confirm its client address", m.GetName())
	}
	cctx, cancel := context.WithTimeout(ctx, mb.cfg.ElectionTimeout())
	defer cancel()
	resp, err := client.Join(cctx, &wirepb.JoinRequest{Name: m.GetName(), ClusterId: mb.clusterID, Confirm: true})
	if err != nil {
		return status.Errorf(codes.Unavailable, "member %s did not confirm its client address: %v", m.GetName(), err)
	}
	if got := resp.GetMember(); resp.GetClusterId() != mb.clusterID || got.GetId() != m.GetId() || got.GetClientAddr() != addr {
		return status.Errorf(codes.PermissionDenied, "member %s at its peer address advertises client address %q, not %q: "+
			"a Join may change only the caller's own member entry", m.GetName(), got.GetClientAddr(), addr)
	}
	return nil
}

// confirmSelf answers the leader's confirm Join (confirmClientAddr) about this node: its own record, with
// the client address it advertises. It changes nothing.
func (mb *membership) confirmSelf(req *wirepb.JoinRequest) (*wirepb.JoinResponse, error) {
	if req.GetName() != mb.cfg.Name || req.GetClusterId() != mb.clusterID {
		return nil, status.Errorf(codes.FailedPrecondition, "this node is %s in cluster %s, not %s in cluster %s",
			mb.cfg.Name, leasepb.FormatID(mb.clusterID), req.GetName(), leasepb.FormatID(req.GetClusterId()))
	}
	return &wirepb.JoinResponse{ClusterId: mb.clusterID,
		Member: &leasepb.Member{Id: mb.id, Name: mb.cfg.Name, ClientAddr: mb.clientAddr}}, nil
}

// forwardCaller checks that a forwarded write comes from a member that may carry it: with peer TLS, the
// member its certificate names (and which the request says forwarded it); without, a member of the
// table, and no client identity, since nothing vouches for the one it would carry.
func (n *node) forwardCaller(ctx context.Context, req *wirepb.ForwardRequest) error {
	from := req.GetFrom()
	if n.members.member(from) == nil {
		return status.Errorf(codes.PermissionDenied, "forwarded write from %s, which is not a member of this cluster",
			leasepb.FormatID(from))
	}
	if n.cfg.PeerTLS != nil {
		if caller := transport.Caller(ctx); caller != from {
			return status.Errorf(codes.PermissionDenied, "forwarded write says it is from member %s, but the caller's certificate names %s",
				leasepb.FormatID(from), leasepb.FormatID(caller))
		}
		return nil
	}
	if req.GetIdentity() != "" {
		return status.Errorf(codes.PermissionDenied, "a forwarded write carries a client identity (%q) over a plaintext peer port, "+
			"where nothing vouches for it: client identities travel only between members with peer TLS", req.GetIdentity())
	}
	return nil
}

// forwardsIdentity reports whether this node may forward a write carrying identity to the leader: always
// with peer TLS, and without only when there is no identity to carry.
func (n *node) forwardsIdentity(identity string) bool {
	return identity == "" || n.cfg.PeerTLS != nil
}
