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
func (n *node) mayAnnounce(ctx context.Context, req *wirepb.JoinRequest, m *leasepb.Member, addr string) error {
	if n.cfg.PeerTLS != nil {
		if caller := transport.Caller(ctx); caller != m.GetId() {
			return status.Errorf(codes.PermissionDenied, "a Join may change only the caller's own member entry: "+
				"the caller's certificate names member %s, not %s (%s)", leasepb.FormatID(caller), leasepb.FormatID(m.GetId()), m.GetName())
		}
		return nil
	}
	if req.GetClusterId() != n.clusterID {
		return status.Errorf(codes.PermissionDenied, "a Join that changes a member's client address must come from that member "+
			"and give its cluster id (%s is not this cluster)", leasepb.FormatID(req.GetClusterId()))
	}
	return n.confirmClientAddr(ctx, m, addr)
}

// confirmClientAddr asks member m, at its peer address in the member table, whether addr is the client
// address it advertises: on a plaintext peer port, who reaches that address is the member.
func (n *node) confirmClientAddr(ctx context.Context, m *leasepb.Member, addr string) error {
	client, ok := n.transport.PeerClient(m.GetId())
	if !ok {
		return status.Errorf(codes.Unavailable, "cannot reach member %s to confirm its client address", m.GetName())
	}
	cctx, cancel := context.WithTimeout(ctx, n.cfg.ElectionTimeout())
	defer cancel()
	resp, err := client.Join(cctx, &wirepb.JoinRequest{Name: m.GetName(), ClusterId: n.clusterID, Confirm: true})
	if err != nil {
		return status.Errorf(codes.Unavailable, "member %s did not confirm its client address: %v", m.GetName(), err)
	}
	if got := resp.GetMember(); resp.GetClusterId() != n.clusterID || got.GetId() != m.GetId() || got.GetClientAddr() != addr {
		return status.Errorf(codes.PermissionDenied, "member %s at its peer address advertises client address %q, not %q: "+
			"a Join may change only the caller's own member entry", m.GetName(), got.GetClientAddr(), addr)
	}
	return nil
}

// confirmSelf answers the leader's confirm Join (confirmClientAddr) about this node: its own record, with
// the client address it advertises. It changes nothing.
func (n *node) confirmSelf(req *wirepb.JoinRequest) (*wirepb.JoinResponse, error) {
	if req.GetName() != n.cfg.Name || req.GetClusterId() != n.clusterID {
		return nil, status.Errorf(codes.FailedPrecondition, "this node is %s in cluster %s, not %s in cluster %s",
			n.cfg.Name, leasepb.FormatID(n.clusterID), req.GetName(), leasepb.FormatID(req.GetClusterId()))
	}
	return &wirepb.JoinResponse{ClusterId: n.clusterID,
		Member: &leasepb.Member{Id: n.id, Name: n.cfg.Name, ClientAddr: n.clientAddr}}, nil
}
