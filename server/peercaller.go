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
// table (mayAnnounce, join.go), and a forwarded write carries no client identity at all (a follower with a plaintext peer port
// sends such writes' clients to the leader instead: forwardsIdentity).

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
