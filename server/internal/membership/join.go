package membership

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/raft/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server/internal/errs"
	"github.com/leased/leased/server/transport"
)

// The peer port's Join RPC, answered by the leader (a follower relays it once). A member asks it about
// itself by name in three situations:
//   - a new member's first start (--initial-cluster-state existing): it learns the cluster id, its raft id
//     and the current members' peer addresses (server/discover.go);
//   - a running member whose advertised client address is not the one in the member table (every founding
//     member, at first: --initial-cluster carries only peer addresses; a new member, once added) announces
//     it to the leader directly (AnnounceLoop), which records it only if the asker proves it is that
//     member (mayAnnounce);
//   - a member that has seen no leader for a while asks whether it was removed (RemovalLoop): a removed
//     node rarely applies its own removal, since the leader stops sending to it once it applies it.

// ServeJoin answers a member asking about itself.
func (mb *Members) ServeJoin(ctx context.Context, req *wirepb.JoinRequest) (*wirepb.JoinResponse, error) {
	if err := validName("name", req.GetName(), maxMemberName); err != nil {
		return nil, mb.host.Status(err)
	}
	if req.GetClientAddr() != "" && !ValidAdvertise(req.GetClientAddr()) {
		return nil, mb.host.Status(errs.Invalid("client_addr", "%q is not a host:port clients can dial", req.GetClientAddr()))
	}
	switch {
	case req.GetProbe():
		return mb.answerProbe(req)
	case req.GetConfirm():
		return mb.confirmSelf(req)
	}
	if !mb.host.IsLeader() {
		return mb.relayJoin(ctx, req)
	}
	return mb.answerJoin(ctx, req, false)
}

// answerJoin is the leader's answer to a Join; local says this node asks about itself (no proof needed).
func (mb *Members) answerJoin(ctx context.Context, req *wirepb.JoinRequest, local bool) (*wirepb.JoinResponse, error) {
	var m *leasepb.Member
	var removed bool
	mb.host.ReadFSM(func(sm *fsm.FSM) {
		m = sm.MemberByName(req.GetName())
		if id := req.GetId(); id != 0 {
			removed = sm.WasRemoved(id)
		} else {
			removed = m == nil && nameRemoved(sm, mb.clusterID, req.GetName())
		}
	})
	switch {
	case removed && !req.GetRejoin():
		return &wirepb.JoinResponse{ClusterId: mb.clusterID, Removed: true}, nil
	case req.GetRejoin() && (m != nil || removed):
		return mb.serveRejoin(ctx, req, m)
	case m == nil:
		return nil, mb.host.Status(fmt.Errorf("%w: no member named %q in cluster %s: add it first with "+
			"`leasectl member add %s --peer-addr HOST:PORT`", errs.ErrMemberNotFound, req.GetName(), leasepb.FormatID(mb.clusterID), req.GetName()))
	}
	started := mb.memberStarted(m)
	if a := req.GetClientAddr(); a != "" && a != m.GetClientAddr() {
		if !local {
			if err := mb.mayAnnounce(ctx, req, m, a); err != nil {
				return nil, err
			}
		}
		if err := mb.updateClientAddr(ctx, m, a); err != nil {
			return nil, mb.host.Status(err)
		}
		m = mb.Member(m.GetId())
	}
	return &wirepb.JoinResponse{ClusterId: mb.clusterID, Member: m, Members: mb.Table(), Started: started}, nil
}

// relayJoin hands a Join to the leader, once.
func (mb *Members) relayJoin(ctx context.Context, req *wirepb.JoinRequest) (*wirepb.JoinResponse, error) {
	leader := mb.host.LeaderID()
	if req.GetRelayed() || leader == raft.None {
		return nil, mb.host.Status(mb.host.NotLeaderErr())
	}
	client, ok := mb.host.PeerClient(leader)
	if !ok {
		return nil, mb.host.Status(errs.ErrNoLeader)
	}
	// A relay cannot vouch for the asker's client address, so it relays the request without one (the member
	// announces its address to the leader itself: AnnounceLoop); a rejoin or a removal check goes on as asked.
	relayed := proto.CloneOf(req)
	relayed.Relayed, relayed.ClientAddr = true, ""
	return client.Join(ctx, relayed)
}

// askLeader sends this node's own Join to the leader (or answers it here when this node leads).
func (mb *Members) askLeader(ctx context.Context) (*wirepb.JoinResponse, error) {
	req := &wirepb.JoinRequest{Name: mb.cfg.Name, ClientAddr: mb.cfg.ClientAddr, ClusterId: mb.clusterID, Id: mb.id}
	leader := mb.host.LeaderID()
	switch {
	case leader == raft.None:
		return nil, errs.ErrNoLeader
	case leader == mb.id:
		return mb.answerJoin(ctx, req, true)
	}
	client, ok := mb.host.PeerClient(leader)
	if !ok {
		return nil, errs.ErrNoLeader
	}
	req.Relayed = true
	return client.Join(ctx, req)
}

// AnnounceLoop puts this node's advertised client address into the member table, once it is a member
// there with another address (or none), so that every node can hint clients to it. It returns when the
// table has the address, or when ctx ends.
func (mb *Members) AnnounceLoop(ctx context.Context) {
	tick := time.NewTicker(mb.cfg.ElectionTimeout)
	defer tick.Stop()
	for {
		if m := mb.Member(mb.id); m != nil && m.GetClientAddr() == mb.cfg.ClientAddr {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if mb.Member(mb.id) == nil || mb.host.LeaderID() == raft.None {
			continue // not applied its own membership yet, or no one to ask
		}
		actx, acancel := context.WithTimeout(ctx, mb.cfg.ProposalTimeout)
		_, err := mb.askLeader(actx)
		acancel()
		if err != nil {
			mb.log.Debug("could not announce the client address yet", "err", err)
		}
	}
}

// RemovalLoop asks, whenever this node has seen no leader for removalCheckAfter, whether it was removed
// from the cluster; if the leader says so, the node records it and stops. It returns when ctx ends.
func (mb *Members) RemovalLoop(ctx context.Context) {
	every := 3 * mb.cfg.ElectionTimeout
	tick := time.NewTicker(every)
	defer tick.Stop()
	lastLeader := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-mb.host.Halted():
			return
		case <-tick.C:
		}
		if mb.host.LeaderID() != raft.None {
			lastLeader = time.Now()
			continue
		}
		if time.Since(lastLeader) < every {
			continue
		}
		if mb.askPeersRemoved(ctx) {
			mb.host.Fail(mb.Removed(mb.host.AppliedIndex()))
			mb.host.Halt()
			return
		}
	}
}

// askPeersRemoved asks every peer in the member table (each relays to its leader) whether this node was
// removed, and reports whether one answered that it was.
func (mb *Members) askPeersRemoved(ctx context.Context) bool {
	req := &wirepb.JoinRequest{Name: mb.cfg.Name, ClusterId: mb.clusterID, Id: mb.id}
	for _, m := range mb.Table() {
		if m.GetId() == mb.id {
			continue
		}
		client, ok := mb.host.PeerClient(m.GetId())
		if !ok {
			continue
		}
		actx, cancel := context.WithTimeout(ctx, mb.cfg.ElectionTimeout)
		resp, err := client.Join(actx, req)
		cancel()
		if err == nil && resp.GetRemoved() && resp.GetClusterId() == mb.clusterID {
			return true
		}
		if err != nil && status.Code(err) != codes.Unavailable && !errors.Is(err, context.DeadlineExceeded) {
			mb.log.Debug("removal check", "peer", leasepb.FormatID(m.GetId()), "err", err)
		}
	}
	return false
}

// mayAnnounce checks that the asker of a Join may change member m's client address to addr: it is m.
func (mb *Members) mayAnnounce(ctx context.Context, req *wirepb.JoinRequest, m *leasepb.Member, addr string) error {
	if mb.cfg.PeerTLS {
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
func (mb *Members) confirmClientAddr(ctx context.Context, m *leasepb.Member, addr string) error {
	client, ok := mb.host.PeerClient(m.GetId())
	if !ok {
		return status.Errorf(codes.Unavailable, "cannot reach member %s to confirm its client address", m.GetName())
	}
	cctx, cancel := context.WithTimeout(ctx, mb.cfg.ElectionTimeout)
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
func (mb *Members) confirmSelf(req *wirepb.JoinRequest) (*wirepb.JoinResponse, error) {
	if req.GetName() != mb.cfg.Name || req.GetClusterId() != mb.clusterID {
		return nil, status.Errorf(codes.FailedPrecondition, "this node is %s in cluster %s, not %s in cluster %s",
			mb.cfg.Name, leasepb.FormatID(mb.clusterID), req.GetName(), leasepb.FormatID(req.GetClusterId()))
	}
	return &wirepb.JoinResponse{ClusterId: mb.clusterID,
		Member: &leasepb.Member{Id: mb.id, Name: mb.cfg.Name, ClientAddr: mb.cfg.ClientAddr}}, nil
}

// GossipLoop keeps this node's gossiped metadata current (its ids, whether it knows a leader) and, while
// it knows no other member, joins Config.Join. It returns when ctx ends.
func (mb *Members) GossipLoop(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		m := mb.cfg.localMeta()
		m.Id, m.ClusterId = mb.id, mb.clusterID
		m.HasLeader = mb.host.LeaderID() != 0
		if mb.gossip.setMeta(m) {
			mb.gossip.update()
		}
		if len(mb.cfg.Join) > 0 && mb.gossip.Alone() {
			if err := mb.gossip.Join(mb.cfg.Join); err != nil {
				mb.log.Debug("gossip join", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
