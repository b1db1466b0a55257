package membership

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
	"github.com/leased/leased/server/internal/errs"
)

// A member whose data dir was wiped and that starts again with the flags it was founded (or joined) with
// would come back with an empty log under the raft id the cluster knows: it would vote as if it had
// never acknowledged anything (raft's amnesia), and the leader, which remembers how far its log reached,
// never sends it what it lost. So a node starting on an empty data dir first asks its peers whether they
// know it as a member that has run (wirepb.JoinResponse.started). If so it refuses to start, naming the
// runbook — or, with --auto-rejoin, asks the leader to retire its old raft id and add its name back
// as a learner under a new one (serveRejoin); it then catches up like any new member and the leader
// promotes it once it has.

// memberStarted reports whether member m has run before, so that its log cannot be empty: as a voter it
// announced its client address (a founding member's record has none until it runs), or this node, if it
// leads, has seen m's log reach some index.
func (mb *Members) memberStarted(m *leasepb.Member) bool {
	if !m.GetIsLearner() && m.GetClientAddr() != "" {
		return true
	}
	match, _, ok := mb.learnerProgress(m.GetId())
	return ok && match > 0
}

// serveRejoin answers, on the leader, a member that lost its data dir (m, or nil for a removed name; a
// name never added is NotFound): it retires the member's current raft id (a removal, with the usual
// quorum check) and adds the name back as a learner under its next id. Every step is idempotent, so the asker retries until it has an answer. A member that has not run
// yet (a retry after the add) is answered as it is.
func (mb *Members) serveRejoin(ctx context.Context, req *wirepb.JoinRequest, m *leasepb.Member) (*wirepb.JoinResponse, error) {
	peerAddr := cmp.Or(req.GetPeerAddr(), m.GetPeerAddr())
	if err := validMemberAddrs(req.GetName(), peerAddr, req.GetClientAddr()); err != nil {
		return nil, mb.host.Status(err)
	}
	if m != nil && !mb.memberStarted(m) {
		return &wirepb.JoinResponse{ClusterId: mb.clusterID, Member: m, Members: mb.Table()}, nil
	}
	if m != nil {
		if err := mb.checkRetire(ctx, m); err != nil {
			return nil, mb.host.Status(err)
		}
		mb.log.Warn("a member lost its data dir: retiring its raft id and adding it again under a new one",
			"name", m.GetName(), "old_id", leasepb.FormatID(m.GetId()))
		if err := mb.Remove(ctx, m.GetId()); err != nil && !errors.Is(err, errs.ErrMemberNotFound) {
			return nil, mb.host.Status(err)
		}
	}
	added, err := mb.Add(ctx, req.GetName(), peerAddr, req.GetClientAddr())
	if err != nil {
		return nil, mb.host.Status(err)
	}
	mb.log.Info("member added again as a learner", "name", added.GetName(), "id", leasepb.FormatID(added.GetId()))
	return &wirepb.JoinResponse{ClusterId: mb.clusterID, Member: mb.Member(added.GetId()), Members: mb.Table()}, nil
}

// checkRetire refuses to retire a member that is evidently running: this node, or one the leader hears
// from. raft's RecentActive is cleared at every quorum check (once an election timeout) and set again by
// the member's next answer, so it is sampled every tick for an election timeout: a running member sets it
// within a heartbeat, while a wiped member's old process is gone and never does.
func (mb *Members) checkRetire(ctx context.Context, m *leasepb.Member) error {
	if m.GetId() == mb.id {
		return fmt.Errorf("%w: member %q is this leader, which runs", errs.ErrMembershipRefused, m.GetName())
	}
	deadline := time.Now().Add(mb.cfg.ElectionTimeout + mb.cfg.TickInterval)
	tick := time.NewTicker(mb.cfg.TickInterval)
	defer tick.Stop()
	for {
		st := mb.host.RaftStatus()
		if st.RaftState != raft.StateLeader {
			return mb.host.NotLeaderErr()
		}
		if pr, ok := st.Progress[m.GetId()]; ok && pr.RecentActive {
			return fmt.Errorf("%w: member %q (%s) answers the leader: it still runs somewhere; retrying",
				errs.ErrMembershipRefused, m.GetName(), leasepb.FormatID(m.GetId()))
		}
		if time.Now().After(deadline) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-mb.host.Halted():
			return mb.host.StoppedErr()
		case <-tick.C:
		}
	}
}

// answerProbe tells a node about to found a cluster on an empty data dir what this node's member table
// says of it, without a leader.
func (mb *Members) answerProbe(req *wirepb.JoinRequest) (*wirepb.JoinResponse, error) {
	var m *leasepb.Member
	var removed, empty bool
	mb.host.ReadFSM(func(sm *fsm.FSM) {
		m, empty = sm.MemberByName(req.GetName()), len(sm.Members()) == 0
		removed = m == nil && nameRemoved(sm, mb.clusterID, req.GetName())
	})
	switch {
	case empty:
		return nil, status.Error(codes.Unavailable, "this node has no member table yet")
	case m == nil && !removed:
		return nil, mb.host.Status(fmt.Errorf("%w: no member named %q in cluster %s", errs.ErrMemberNotFound, req.GetName(), leasepb.FormatID(mb.clusterID)))
	}
	resp := &wirepb.JoinResponse{ClusterId: mb.clusterID, Member: m, Removed: removed, Members: mb.Table()}
	resp.Started = m != nil && mb.memberStarted(m)
	return resp, nil
}
