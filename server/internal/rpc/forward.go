package rpc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/raft/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/server/internal/auth"
	"github.com/leased/leased/server/internal/errs"
	"github.com/leased/leased/server/transport"
)

// One path for every write (Acquire, Renew, Release, KeepAlive, Proclaim). A write travels as a ForwardRequest,
// whichever node it reached: the gRPC handlers call Write, the peer-port Forward RPC calls ServeForward,
// and both go through serveWrite, which validates, then runs the write here if this node leads, or else
// forwards it to the leader once (a node serving a forwarded write never forwards it again). Validation,
// the response header and the error status are applied there and nowhere else.

// Write serves a client's write: here if this node leads, else on the leader (one hop).
// The client's identity (internal/auth) is decided here, by the node the client reached, and travels with the
// request to the leader.
func (o *LeaseOps) Write(ctx context.Context, req *wirepb.ForwardRequest) (*wirepb.ForwardResponse, error) {
	id, err := o.authz.Identity(ctx)
	if err != nil {
		return nil, o.Status(err)
	}
	req.Identity = id
	return o.serveWrite(ctx, req, true)
}

// ServeForward serves a write a follower forwarded. It never forwards again: a node that is not the
// leader answers Unavailable with its leader hint, and the follower's client retries.
func (o *LeaseOps) ServeForward(ctx context.Context, req *wirepb.ForwardRequest) (*wirepb.ForwardResponse, error) {
	if err := o.forwardCaller(ctx, req); err != nil {
		o.metrics.refused()
		return nil, err
	}
	return o.serveWrite(ctx, req, false)
}

// serveWrite validates req (with this node's limits: a leader never trusts a follower to have checked),
// then runs it here if this node leads, or forwards it to the leader if mayForward. Errors come back as
// gRPC statuses with the leader hint.
func (o *LeaseOps) serveWrite(ctx context.Context, req *wirepb.ForwardRequest, mayForward bool) (*wirepb.ForwardResponse, error) {
	if err := o.cfg.Limits.write(req); err != nil {
		o.metrics.refused()
		return nil, o.Status(err)
	}
	if o.cfg.ClientCertAuth && req.GetIdentity() == "" {
		// Forwarded by a peer that does not require client certificates: a misconfigured member.
		o.metrics.refused()
		return nil, o.Status(auth.Unauthenticated("the write reached this node without a client identity (is --client-cert-auth set on every member?)"))
	}
	if !o.IsLeader() {
		if !mayForward || !o.forwardsIdentity(req.GetIdentity()) {
			o.metrics.refused() // the client retries at the leader its hint names
			return nil, o.Status(o.NotLeaderErr())
		}
		return o.forwardFollowing(ctx, req)
	}
	if err := o.authz.AuthorizeWrite(req); err != nil {
		o.metrics.refused()
		return nil, o.Status(err)
	}
	resp, err := o.runWrite(ctx, req)
	if err != nil {
		return nil, o.Status(err)
	}
	setHeader(resp, o.header())
	return resp, nil
}

// runWrite runs a validated write on this node, the leader (leases.go).
func (o *LeaseOps) runWrite(ctx context.Context, req *wirepb.ForwardRequest) (*wirepb.ForwardResponse, error) {
	switch r := req.GetRequest().(type) {
	case *wirepb.ForwardRequest_Acquire:
		a, err := o.acquire(ctx, r.Acquire, req.GetIdentity())
		return &wirepb.ForwardResponse{Response: &wirepb.ForwardResponse_Acquire{Acquire: a}}, err
	case *wirepb.ForwardRequest_Renew:
		a, err := o.renew(ctx, r.Renew)
		return &wirepb.ForwardResponse{Response: &wirepb.ForwardResponse_Renew{Renew: a}}, err
	case *wirepb.ForwardRequest_Release:
		a, err := o.release(ctx, r.Release, req.GetIdentity())
		return &wirepb.ForwardResponse{Response: &wirepb.ForwardResponse_Release{Release: a}}, err
	case *wirepb.ForwardRequest_KeepAlive:
		a, err := o.keepAlive(ctx, r.KeepAlive)
		return &wirepb.ForwardResponse{Response: &wirepb.ForwardResponse_KeepAlive{KeepAlive: a}}, err
	case *wirepb.ForwardRequest_Proclaim:
		a, err := o.proclaim(ctx, r.Proclaim, req.GetIdentity())
		return &wirepb.ForwardResponse{Response: &wirepb.ForwardResponse_Proclaim{Proclaim: a}}, err
	default:
		return nil, invalid("request", "not a write this node knows") // Limits.write refused it already
	}
}

// forwardFollowing forwards a write to the leader, once there is one (awaitElection), and follows a change
// of leader that happens meanwhile:
// the old leader may be gone without a word (frozen, its disk stalled), and a write waiting on it would
// wait for its caller's deadline although another leader is there. A renewal (KeepAlive, Renew) is then
// served again, by this node if it now leads or by the new leader: renewing twice is harmless. Any other
// write may have been run by the old leader, so its caller learns at once that the outcome is unknown,
// with the new leader's hint, and retries there (its request id or token makes that safe).
func (o *LeaseOps) forwardFollowing(ctx context.Context, req *wirepb.ForwardRequest) (*wirepb.ForwardResponse, error) {
	if o.leader() == raft.None {
		if err := o.awaitElection(ctx); err != nil {
			return nil, o.Status(err)
		}
		if o.IsLeader() {
			return o.serveWrite(ctx, req, false)
		}
	}
	for switches := 0; ; switches++ {
		resp, err := o.forward(ctx, req)
		if !errors.Is(err, errLeaderSwitched) {
			return resp, err
		}
		if !isRenewal(req) || switches == maxLeaderSwitches {
			return nil, o.Status(errs.UnknownOutcome(fmt.Errorf("the leader changed while the write was forwarded to it: %w", ErrNoLeader)))
		}
		if err := o.awaitLeader(ctx, o.cfg.ElectionTimeout); err != nil {
			return nil, o.Status(err)
		}
		if o.IsLeader() {
			return o.serveWrite(ctx, req, false)
		}
	}
}

// maxLeaderSwitches bounds how many changes of leader one renewal follows before it gives up.
const maxLeaderSwitches = 3

// maxElectionWait bounds, in election timeouts, how long a write that reached a node knowing no leader
// waits for one (awaitElection).
const maxElectionWait = 4

// awaitElection waits, for a write that reached this node while it knows no leader, until an election
// names one: at most half of what is left of the caller's deadline, so that the caller still hears "no
// leader" in time to try another node (a node cut off from the rest costs each client that once), and at
// most maxElectionWait election timeouts. Nothing was sent anywhere yet, so any write may wait. Answered at
// once, the writes of a leader's crash would bounce between the followers while the election runs, and
// the client's growing backoff would find the new leader up to half a second after it is there.
func (o *LeaseOps) awaitElection(ctx context.Context) error {
	wait := maxElectionWait * o.cfg.ElectionTimeout
	if dl, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(dl)/2)
	}
	return o.awaitLeader(ctx, wait)
}

// awaitLeader returns once this node knows a leader (at once if it does), or ctx's error, or ErrNoLeader
// after wait: a renewal that follows a leader change waits out the election rather than bounce its caller.
func (o *LeaseOps) awaitLeader(ctx context.Context, wait time.Duration) error {
	timeout := time.NewTimer(wait)
	defer timeout.Stop()
	for {
		switched := o.leaderChanged()
		if o.leader() != raft.None {
			return nil
		}
		select {
		case <-switched:
		case <-timeout.C:
			return ErrNoLeader
		case <-ctx.Done():
			return ctx.Err()
		case <-o.done:
			return o.StoppedErr()
		}
	}
}

// errLeaderSwitched: the leader this node forwarded a write to is no longer the leader it knows.
var errLeaderSwitched = errors.New("the leader changed while the write was forwarded")

// isRenewal reports whether req only renews leases (idempotent: it can be served twice).
func isRenewal(req *wirepb.ForwardRequest) bool {
	switch req.GetRequest().(type) {
	case *wirepb.ForwardRequest_KeepAlive, *wirepb.ForwardRequest_Renew:
		return true
	}
	return false
}

// forward sends a write to the leader over the peer connection and relays its answer (or its status). If
// this node's view of the leader changes before the answer comes, it stops waiting and returns
// errLeaderSwitched (bare, not a status).
func (o *LeaseOps) forward(ctx context.Context, req *wirepb.ForwardRequest) (*wirepb.ForwardResponse, error) {
	switched := o.leaderChanged()
	leader := o.leader()
	if leader == raft.None || leader == o.id {
		return nil, o.Status(o.NotLeaderErr())
	}
	client, ok := o.peerClient(leader)
	if !ok {
		return nil, o.Status(ErrNoLeader)
	}
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-switched:
			cancel(errLeaderSwitched)
		case <-fctx.Done():
		}
	}()
	req.ClusterId, req.From = o.clusterID, o.id
	resp, err := client.Forward(fctx, req)
	if err != nil {
		if errors.Is(context.Cause(fctx), errLeaderSwitched) && ctx.Err() == nil {
			return nil, errLeaderSwitched
		}
		if st, ok := status.FromError(err); ok && st.Code() != codes.Unknown && (st.Code() != codes.Unavailable || hasLeaderHint(st)) {
			return nil, err // the leader's own answer (it says whether the outcome is known), or a deadline
		}
		// The peer call failed in transit: the leader may have run the write, so its outcome is unknown.
		return nil, o.Status(errs.UnknownOutcome(fmt.Errorf("forward to the leader: %v: %w", err, ErrNoLeader)))
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
func (o *LeaseOps) header() *leasepb.ResponseHeader {
	hint := o.hint()
	return &leasepb.ResponseHeader{
		ClusterId:    o.clusterID,
		MemberId:     o.id,
		LeaderId:     hint.ID,
		LeaderAddr:   hint.Addr,
		RaftTerm:     o.term(),
		AppliedIndex: o.applied(),
	}
}

func (o *LeaseOps) hint() Hint {
	leader := o.KnownLeader()
	return Hint{ID: leader, Addr: o.ClientAddrOf(leader)}
}

// Status maps an error to a gRPC status, attaching the leader hint.
func (o *LeaseOps) Status(err error) error { return ToStatus(err, o.hint()) }

// A peer call speaks for one member only (decision 15). With peer TLS that member is the one the caller's
// certificate names (transport.Caller); without, there is no credential, so a Join that changes an
// address must be confirmed by the member itself (mayAnnounce, internal/membership/join.go), and a
// forwarded write carries no client identity at all (forwardsIdentity).

// forwardCaller checks that a forwarded write comes from a member that may carry it: with peer TLS, the
// member its certificate names (and which the request says forwarded it); without, a member of the
// table, and no client identity, since nothing vouches for the one it would carry.
func (o *LeaseOps) forwardCaller(ctx context.Context, req *wirepb.ForwardRequest) error {
	from := req.GetFrom()
	if o.Member(from) == nil {
		return status.Errorf(codes.PermissionDenied, "forwarded write from %s, which is not a member of this cluster",
			leasepb.FormatID(from))
	}
	if o.cfg.PeerTLS {
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
func (o *LeaseOps) forwardsIdentity(identity string) bool {
	return identity == "" || o.cfg.PeerTLS
}
