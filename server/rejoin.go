package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/raft/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/fsm"
)

// A member whose data dir was wiped and that starts again with the flags it was founded (or joined) with
// would come back with an empty log under the raft id the cluster knows: it would vote as if it had
// never acknowledged anything (raft's amnesia), and the leader, which remembers how far its log reached,
// never sends it what it lost. So a node starting on an empty data dir first asks its peers whether they
// know it as a member that has run (wirepb.JoinResponse.started). If so it refuses to start, naming the
// runbook — or, with Config.AutoRejoin, asks the leader to retire its old raft id and add its name back
// as a learner under a new one (serveRejoin); it then catches up like any new member and the leader
// promotes it once it has.

// ErrWipedMember is the refusal of a node that starts on an empty data dir while its cluster knows it as
// a member that has run: its data dir was lost.
var ErrWipedMember = errors.New("this member's data dir was lost")

// wipedErr is the refusal of a wiped member started without Config.AutoRejoin.
func wipedErr(cfg Config, resp *wirepb.JoinResponse) error {
	why := fmt.Sprintf("member %q (raft id %s) of cluster %s has run before", cfg.Name,
		leasepb.FormatID(resp.GetMember().GetId()), leasepb.FormatID(resp.GetClusterId()))
	if resp.GetRemoved() {
		why = fmt.Sprintf("member %q was removed from cluster %s", cfg.Name, leasepb.FormatID(resp.GetClusterId()))
	}
	return fmt.Errorf("%w: data dir %s is empty, but %s: an empty log must not take its place. "+
		"Follow the runbook \"Replace a failed node\" in docs/operations.md (remove it, add it again, start it "+
		"with --initial-cluster-state existing), or start it with --auto-rejoin to have it re-added under a new raft id",
		ErrWipedMember, cfg.DataDir, why)
}

// rejoinOrRefuse answers a first start whose cluster knows this member as one that has run (or removed):
// the refusal, or with Config.AutoRejoin the leader's answer to a rejoin.
func rejoinOrRefuse(cfg Config, g *gossip, known *wirepb.JoinResponse) (*wirepb.JoinResponse, error) {
	if !cfg.AutoRejoin {
		return nil, wipedErr(cfg, known)
	}
	cfg.Logger.Warn("the cluster knows this member, but its data dir is empty: asking to be added again under a new raft id (--auto-rejoin)",
		"cluster", leasepb.FormatID(known.GetClusterId()), "old_id", leasepb.FormatID(known.GetMember().GetId()), "removed", known.GetRemoved())
	resp, err := discover(cfg, g, true)
	if err == nil && resp.GetMember() == nil {
		err = errors.New("the leader's answer names no member")
	}
	if err != nil {
		return nil, fmt.Errorf("rejoin the cluster: %w", err)
	}
	return resp, nil
}

// memberStarted reports whether member m has run before, so that its log cannot be empty: as a voter it
// announced its client address (a founding member's record has none until it runs), or this node, if it
// leads, has seen m's log reach some index.
func (n *node) memberStarted(m *leasepb.Member) bool {
	if !m.GetIsLearner() && m.GetClientAddr() != "" {
		return true
	}
	match, _, ok := n.learnerProgress(m.GetId())
	return ok && match > 0
}

// serveRejoin answers, on the leader, a member that lost its data dir (m, or nil for a removed name; a
// name never added is NotFound): it retires the member's current raft id (a removal, with the usual
// quorum check) and adds the name back as a learner under its next id. Every step is idempotent, so the asker retries until it has an answer. A member that has not run
// yet (a retry after the add) is answered as it is.
func (n *node) serveRejoin(ctx context.Context, req *wirepb.JoinRequest, m *leasepb.Member) (*wirepb.JoinResponse, error) {
	peerAddr := cmp.Or(req.GetPeerAddr(), m.GetPeerAddr())
	if err := validMemberAddrs(req.GetName(), peerAddr, req.GetClientAddr()); err != nil {
		return nil, n.ops.status(err)
	}
	if m != nil && !n.memberStarted(m) {
		return &wirepb.JoinResponse{ClusterId: n.clusterID, Member: m, Members: n.memberTable()}, nil
	}
	if m != nil {
		if err := n.checkRetire(ctx, m); err != nil {
			return nil, n.ops.status(err)
		}
		n.log.Warn("a member lost its data dir: retiring its raft id and adding it again under a new one",
			"name", m.GetName(), "old_id", leasepb.FormatID(m.GetId()))
		if err := n.removeMember(ctx, m.GetId()); err != nil && !errors.Is(err, ErrMemberNotFound) {
			return nil, n.ops.status(err)
		}
	}
	added, err := n.addMember(ctx, req.GetName(), peerAddr, req.GetClientAddr())
	if err != nil {
		return nil, n.ops.status(err)
	}
	n.log.Info("member added again as a learner", "name", added.GetName(), "id", leasepb.FormatID(added.GetId()))
	return &wirepb.JoinResponse{ClusterId: n.clusterID, Member: n.member(added.GetId()), Members: n.memberTable()}, nil
}

// checkRetire refuses to retire a member that is evidently running: this node, or one the leader hears
// from. raft's RecentActive is cleared at every quorum check (once an election timeout) and set again by
// the member's next answer, so it is sampled every tick for an election timeout: a running member sets it
// within a heartbeat, while a wiped member's old process is gone and never does.
func (n *node) checkRetire(ctx context.Context, m *leasepb.Member) error {
	if m.GetId() == n.id {
		return fmt.Errorf("%w: member %q is this leader, which runs", ErrMembershipRefused, m.GetName())
	}
	deadline := time.Now().Add(n.cfg.ElectionTimeout() + n.cfg.TickInterval)
	tick := time.NewTicker(n.cfg.TickInterval)
	defer tick.Stop()
	for {
		st := n.raft.Status()
		if st.RaftState != raft.StateLeader {
			return n.notLeaderErr()
		}
		if pr, ok := st.Progress[m.GetId()]; ok && pr.RecentActive {
			return fmt.Errorf("%w: member %q (%s) answers the leader: it still runs somewhere; retrying",
				ErrMembershipRefused, m.GetName(), leasepb.FormatID(m.GetId()))
		}
		if time.Now().After(deadline) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-n.done:
			return n.stoppedErr()
		case <-tick.C:
		}
	}
}

// answerProbe tells a node about to found a cluster on an empty data dir what this node's member table
// says of it, without a leader.
func (n *node) answerProbe(req *wirepb.JoinRequest) (*wirepb.JoinResponse, error) {
	var m *leasepb.Member
	var removed, empty bool
	n.readFSM(func(sm *fsm.FSM) {
		m, empty = sm.MemberByName(req.GetName()), len(sm.Members()) == 0
		removed = m == nil && nameRemoved(sm, n.clusterID, req.GetName())
	})
	switch {
	case empty:
		return nil, status.Error(codes.Unavailable, "this node has no member table yet")
	case m == nil && !removed:
		return nil, n.ops.status(fmt.Errorf("%w: no member named %q in cluster %s", ErrMemberNotFound, req.GetName(), leasepb.FormatID(n.clusterID)))
	}
	resp := &wirepb.JoinResponse{ClusterId: n.clusterID, Member: m, Removed: removed, Members: n.memberTable()}
	resp.Started = m != nil && n.memberStarted(m)
	return resp, nil
}

// rejoinRefused reports whether a Join error ends a rejoin for good (others, such as a removal refused
// while the leader still hears from the old id, are retried).
func rejoinRefused(err error) bool { return status.Code(err) == codes.PermissionDenied }
