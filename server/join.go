package server

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
	"github.com/leased/leased/server/transport"
)

// The peer port's Join RPC, answered by the leader (a follower relays it once). A member asks it about
// itself by name in three situations:
//   - a new member's first start (--initial-cluster-state existing): it learns the cluster id, its raft id
//     and the current members' peer addresses (New, discover.go);
//   - a running member whose advertised client address is not the one in the member table (every founding
//     member, at first: --initial-cluster carries only peer addresses; a new member, once added) announces
//     it to the leader directly (announceLoop), which records it only if the asker proves it is that
//     member (mayAnnounce);
//   - a member that has seen no leader for a while asks whether it was removed (removalLoop): a removed
//     node rarely applies its own removal, since the leader stops sending to it once it applies it.

// serveJoin answers a member asking about itself.
func (mb *membership) serveJoin(ctx context.Context, req *wirepb.JoinRequest) (*wirepb.JoinResponse, error) {
	if err := validName("name", req.GetName(), maxMemberName); err != nil {
		return nil, mb.host.status(err)
	}
	if req.GetClientAddr() != "" && !validAdvertise(req.GetClientAddr()) {
		return nil, mb.host.status(invalid("client_addr", "%q is not a host:port clients can dial", req.GetClientAddr()))
	}
	switch {
	case req.GetProbe():
		return mb.answerProbe(req)
	case req.GetConfirm():
		return mb.confirmSelf(req)
	}
	if !mb.host.isLeader() {
		return mb.relayJoin(ctx, req)
	}
	return mb.answerJoin(ctx, req, false)
}

// answerJoin is the leader's answer to a Join; local says this node asks about itself (no proof needed).
func (mb *membership) answerJoin(ctx context.Context, req *wirepb.JoinRequest, local bool) (*wirepb.JoinResponse, error) {
	var m *leasepb.Member
	var removed bool
	mb.host.readFSM(func(sm *fsm.FSM) {
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
		return nil, mb.host.status(fmt.Errorf("%w: no member named %q in cluster %s: add it first with "+
			"`leasectl member add %s --peer-addr HOST:PORT`", ErrMemberNotFound, req.GetName(), leasepb.FormatID(mb.clusterID), req.GetName()))
	}
	started := mb.memberStarted(m)
	if a := req.GetClientAddr(); a != "" && a != m.GetClientAddr() {
		if !local {
			if err := mb.mayAnnounce(ctx, req, m, a); err != nil {
				return nil, err
			}
		}
		if err := mb.updateClientAddr(ctx, m, a); err != nil {
			return nil, mb.host.status(err)
		}
		m = mb.member(m.GetId())
	}
	return &wirepb.JoinResponse{ClusterId: mb.clusterID, Member: m, Members: mb.memberTable(), Started: started}, nil
}

// relayJoin hands a Join to the leader, once.
func (mb *membership) relayJoin(ctx context.Context, req *wirepb.JoinRequest) (*wirepb.JoinResponse, error) {
	leader := mb.host.leaderID()
	if req.GetRelayed() || leader == raft.None {
		return nil, mb.host.status(mb.host.notLeaderErr())
	}
	client, ok := mb.host.peerClient(leader)
	if !ok {
		return nil, mb.host.status(ErrNoLeader)
	}
	// A relay cannot vouch for the asker's client address, so it relays the request without one (the member
	// announces its address to the leader itself: announceLoop); a rejoin or a removal check goes on as asked.
	relayed := proto.CloneOf(req)
	relayed.Relayed, relayed.ClientAddr = true, ""
	return client.Join(ctx, relayed)
}

// askLeader sends this node's own Join to the leader (or answers it here when this node leads).
func (mb *membership) askLeader(ctx context.Context) (*wirepb.JoinResponse, error) {
	req := &wirepb.JoinRequest{Name: mb.cfg.Name, ClientAddr: mb.clientAddr, ClusterId: mb.clusterID, Id: mb.id}
	leader := mb.host.leaderID()
	switch {
	case leader == raft.None:
		return nil, ErrNoLeader
	case leader == mb.id:
		return mb.answerJoin(ctx, req, true)
	}
	client, ok := mb.host.peerClient(leader)
	if !ok {
		return nil, ErrNoLeader
	}
	req.Relayed = true
	return client.Join(ctx, req)
}

// announceLoop puts this node's advertised client address into the member table, once it is a member
// there with another address (or none), so that every node can hint clients to it. It returns when the
// table has the address, or when stop closes.
func (mb *membership) announceLoop(stop <-chan struct{}) {
	ctx, cancel := stopContext(stop)
	defer cancel()
	tick := time.NewTicker(mb.cfg.ElectionTimeout())
	defer tick.Stop()
	for {
		if m := mb.member(mb.id); m != nil && m.GetClientAddr() == mb.clientAddr {
			return
		}
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		if mb.member(mb.id) == nil || mb.host.leaderID() == raft.None {
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

// removalLoop asks, whenever this node has seen no leader for removalCheckAfter, whether it was removed
// from the cluster; if the leader says so, the node records it and stops. It returns when stop closes.
func (mb *membership) removalLoop(stop <-chan struct{}) {
	ctx, cancel := stopContext(stop)
	defer cancel()
	every := 3 * mb.cfg.ElectionTimeout()
	tick := time.NewTicker(every)
	defer tick.Stop()
	lastLeader := time.Now()
	for {
		select {
		case <-stop:
			return
		case <-mb.host.halted():
			return
		case <-tick.C:
		}
		if mb.host.leaderID() != raft.None {
			lastLeader = time.Now()
			continue
		}
		if time.Since(lastLeader) < every {
			continue
		}
		if mb.askPeersRemoved(ctx) {
			mb.host.fail(mb.removed(mb.host.appliedIndex()))
			mb.host.halt()
			return
		}
	}
}

// askPeersRemoved asks every peer in the member table (each relays to its leader) whether this node was
// removed, and reports whether one answered that it was.
func (mb *membership) askPeersRemoved(ctx context.Context) bool {
	req := &wirepb.JoinRequest{Name: mb.cfg.Name, ClusterId: mb.clusterID, Id: mb.id}
	for _, m := range mb.memberTable() {
		if m.GetId() == mb.id {
			continue
		}
		client, ok := mb.host.peerClient(m.GetId())
		if !ok {
			continue
		}
		actx, cancel := context.WithTimeout(ctx, mb.cfg.ElectionTimeout())
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

// gossipLoop keeps this node's gossiped metadata current (its ids, whether it knows a leader) and, while
// it knows no other member, joins Config.Join. It returns when stop closes.
func (mb *membership) gossipLoop(stop <-chan struct{}) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		m := localMeta(mb.cfg)
		m.Id, m.ClusterId, m.ClientAddr, m.PeerAddr = mb.id, mb.clusterID, mb.clientAddr, mb.peerAddr
		m.HasLeader = mb.host.leaderID() != 0
		if mb.gossip.setMeta(m) {
			mb.gossip.update()
		}
		if len(mb.cfg.Join) > 0 && mb.gossip.ml.NumMembers() < 2 {
			if err := mb.gossip.join(mb.cfg.Join); err != nil {
				mb.log.Debug("gossip join", "err", err)
			}
		}
		select {
		case <-stop:
			return
		case <-tick.C:
		}
	}
}
