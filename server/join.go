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
)

// The peer port's Join RPC, answered by the leader (a follower relays it once). A member asks it about
// itself by name in three situations:
//   - a new member's first start (--initial-cluster-state existing): it learns the cluster id, its raft id
//     and the current members' peer addresses (New, discover.go);
//   - a running member whose advertised client address is not the one in the member table (every founding
//     member, at first: --initial-cluster carries only peer addresses; a new member, once added) announces
//     it to the leader directly (announceLoop), which records it only if the asker proves it is that
//     member (peercaller.go);
//   - a member that has seen no leader for a while asks whether it was removed (removalLoop): a removed
//     node rarely applies its own removal, since the leader stops sending to it once it applies it.

// serveJoin answers a member asking about itself.
func (n *node) serveJoin(ctx context.Context, req *wirepb.JoinRequest) (*wirepb.JoinResponse, error) {
	if err := validName("name", req.GetName(), maxMemberName); err != nil {
		return nil, n.ops.status(err)
	}
	if req.GetClientAddr() != "" && !validAdvertise(req.GetClientAddr()) {
		return nil, n.ops.status(invalid("client_addr", "%q is not a host:port clients can dial", req.GetClientAddr()))
	}
	switch {
	case req.GetProbe():
		return n.answerProbe(req)
	case req.GetConfirm():
		return n.confirmSelf(req)
	}
	if !n.isLeader() {
		return n.relayJoin(ctx, req)
	}
	return n.answerJoin(ctx, req, false)
}

// answerJoin is the leader's answer to a Join; local says this node asks about itself (no proof needed).
func (n *node) answerJoin(ctx context.Context, req *wirepb.JoinRequest, local bool) (*wirepb.JoinResponse, error) {
	var m *leasepb.Member
	var removed bool
	n.readFSM(func(sm *fsm.FSM) {
		m = sm.MemberByName(req.GetName())
		if id := req.GetId(); id != 0 {
			removed = sm.WasRemoved(id)
		} else {
			removed = m == nil && nameRemoved(sm, n.clusterID, req.GetName())
		}
	})
	switch {
	case removed && !req.GetRejoin():
		return &wirepb.JoinResponse{ClusterId: n.clusterID, Removed: true}, nil
	case req.GetRejoin() && (m != nil || removed):
		return n.serveRejoin(ctx, req, m)
	case m == nil:
		return nil, n.ops.status(fmt.Errorf("%w: no member named %q in cluster %s: add it first with "+
			"`leasectl member add %s --peer-addr HOST:PORT`", ErrMemberNotFound, req.GetName(), leasepb.FormatID(n.clusterID), req.GetName()))
	}
	started := n.memberStarted(m)
	if a := req.GetClientAddr(); a != "" && a != m.GetClientAddr() {
		if !local {
			if err := n.mayAnnounce(ctx, req, m, a); err != nil {
				return nil, err
			}
		}
		if err := n.updateClientAddr(ctx, m, a); err != nil {
			return nil, n.ops.status(err)
		}
		m = n.member(m.GetId())
	}
	return &wirepb.JoinResponse{ClusterId: n.clusterID, Member: m, Members: n.memberTable(), Started: started}, nil
}

// relayJoin hands a Join to the leader, once.
func (n *node) relayJoin(ctx context.Context, req *wirepb.JoinRequest) (*wirepb.JoinResponse, error) {
	leader := n.leader.Load()
	if req.GetRelayed() || leader == raft.None {
		return nil, n.ops.status(n.notLeaderErr())
	}
	client, ok := n.transport.PeerClient(leader)
	if !ok {
		return nil, n.ops.status(ErrNoLeader)
	}
	// A relay cannot vouch for the asker's client address, so it relays the request without one (the member
	// announces its address to the leader itself: announceLoop); a rejoin or a removal check goes on as asked.
	relayed := proto.CloneOf(req)
	relayed.Relayed, relayed.ClientAddr = true, ""
	return client.Join(ctx, relayed)
}

// askLeader sends this node's own Join to the leader (or answers it here when this node leads).
func (n *node) askLeader(ctx context.Context) (*wirepb.JoinResponse, error) {
	req := &wirepb.JoinRequest{Name: n.cfg.Name, ClientAddr: n.clientAddr, ClusterId: n.clusterID, Id: n.id}
	leader := n.leader.Load()
	switch {
	case leader == raft.None:
		return nil, ErrNoLeader
	case leader == n.id:
		return n.answerJoin(ctx, req, true)
	}
	client, ok := n.transport.PeerClient(leader)
	if !ok {
		return nil, ErrNoLeader
	}
	req.Relayed = true
	return client.Join(ctx, req)
}

// announceLoop puts this node's advertised client address into the member table, once it is a member
// there with another address (or none), so that every node can hint clients to it. It returns when the
// table has the address, or when stop closes.
func (n *node) announceLoop(stop <-chan struct{}) {
	ctx, cancel := stopContext(stop)
	defer cancel()
	tick := time.NewTicker(n.cfg.ElectionTimeout())
	defer tick.Stop()
	for {
		if m := n.member(n.id); m != nil && m.GetClientAddr() == n.clientAddr {
			return
		}
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		if n.member(n.id) == nil || n.leader.Load() == raft.None {
			continue // not applied its own membership yet, or no one to ask
		}
		actx, acancel := context.WithTimeout(ctx, n.cfg.ProposalTimeout)
		_, err := n.askLeader(actx)
		acancel()
		if err != nil {
			n.log.Debug("could not announce the client address yet", "err", err)
		}
	}
}

// removalLoop asks, whenever this node has seen no leader for removalCheckAfter, whether it was removed
// from the cluster; if the leader says so, the node records it and stops. It returns when stop closes.
func (n *node) removalLoop(stop <-chan struct{}) {
	ctx, cancel := stopContext(stop)
	defer cancel()
	every := 3 * n.cfg.ElectionTimeout()
	tick := time.NewTicker(every)
	defer tick.Stop()
	lastLeader := time.Now()
	for {
		select {
		case <-stop:
			return
		case <-n.done:
			return
		case <-tick.C:
		}
		if n.leader.Load() != raft.None {
			lastLeader = time.Now()
			continue
		}
		if time.Since(lastLeader) < every {
			continue
		}
		if n.askPeersRemoved(ctx) {
			n.fail(n.removed(n.applied.Load()))
			n.halt()
			return
		}
	}
}

// askPeersRemoved asks every peer in the member table (each relays to its leader) whether this node was
// removed, and reports whether one answered that it was.
func (n *node) askPeersRemoved(ctx context.Context) bool {
	req := &wirepb.JoinRequest{Name: n.cfg.Name, ClusterId: n.clusterID, Id: n.id}
	for _, m := range n.memberTable() {
		if m.GetId() == n.id {
			continue
		}
		client, ok := n.transport.PeerClient(m.GetId())
		if !ok {
			continue
		}
		actx, cancel := context.WithTimeout(ctx, n.cfg.ElectionTimeout())
		resp, err := client.Join(actx, req)
		cancel()
		if err == nil && resp.GetRemoved() && resp.GetClusterId() == n.clusterID {
			return true
		}
		if err != nil && status.Code(err) != codes.Unavailable && !errors.Is(err, context.DeadlineExceeded) {
			n.log.Debug("removal check", "peer", leasepb.FormatID(m.GetId()), "err", err)
		}
	}
	return false
}
