package membership

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server/internal/errs"
	"github.com/leased/leased/server/internal/ids"
)

// Membership changes (the Cluster service's MemberAdd, MemberPromote and MemberRemove, the leader's
// automatic promotion, and a member announcing its client address) run on the leader, one at a time, as
// single-node ConfChangeV2 entries whose context is the changed member's record. A single-node change never
// needs joint consensus (raft applies it as a simple change: any majority of the old configuration
// overlaps any of the new); replacing a node is done as add learner, promote, remove — three such steps.
//
// raft silently drops a conf change while another is unapplied (and right after an election), so a change
// is proposed again until the table shows it; every change is idempotent in raft and in the table, so a
// duplicate is harmless.

// promoteLag is how far (in entries) a learner's log may trail the leader's last index to count as caught
// up, for automatic and manual promotion.
const promoteLag = 100

// changeMembers proposes one conf change and waits until done(table) holds (or ctx ends). It runs on the
// leader only; a change is refused while a conf change from an earlier leader is still unapplied. check,
// if set, runs once this change has the semaphore and no other is pending, so that it sees the table
// every earlier change left (two concurrent adds of one name cannot both pass it).
func (mb *Members) changeMembers(ctx context.Context, typ raftpb.ConfChangeType, m *leasepb.Member, check func() error, done func(*fsm.FSM) bool) error {
	ctx, cancel := context.WithTimeout(ctx, mb.cfg.ProposalTimeout)
	defer cancel()
	select {
	case mb.confSem <- struct{}{}:
		defer func() { <-mb.confSem }()
	case <-ctx.Done():
		return fmt.Errorf("%w: another membership change is in progress", errs.ErrMembershipRefused)
	}
	if !mb.host.IsLeader() {
		return mb.host.NotLeaderErr()
	}
	if err := mb.waitConfApplied(ctx); err != nil {
		return err
	}
	if check != nil {
		if err := check(); err != nil {
			return err
		}
	}
	rec, err := proto.MarshalOptions{Deterministic: true}.Marshal(&leasepb.Member{
		Id: m.GetId(), Name: m.GetName(), PeerAddr: m.GetPeerAddr(), ClientAddr: m.GetClientAddr()})
	if err != nil {
		return fmt.Errorf("encode member: %w", err)
	}
	cc := raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{{Type: &typ, NodeId: proto.Uint64(m.GetId())}}, Context: rec}
	mb.log.Info("proposing membership change", "change", typ.String(), "member", leasepb.FormatID(m.GetId()), "name", m.GetName())
	for {
		if err := mb.host.ProposeConfChange(ctx, &cc); err != nil {
			return errs.UnknownOutcome(mb.host.ProposeErr(ctx, err))
		}
		if applied, err := mb.waitTable(ctx, 2*mb.cfg.ElectionTimeout, done); applied || err != nil {
			return err
		}
		if !mb.host.IsLeader() {
			return errs.UnknownOutcome(mb.host.NotLeaderErr())
		}
	}
}

// waitTable waits up to d for done(table) to hold, re-checking after every applied entry.
func (mb *Members) waitTable(ctx context.Context, d time.Duration, done func(*fsm.FSM) bool) (bool, error) {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for {
		var ok bool
		mb.host.ReadFSM(func(sm *fsm.FSM) { ok = done(sm) })
		if ok {
			return true, nil
		}
		err := mb.host.WaitApplied(wctx, mb.host.AppliedIndex()+1)
		switch {
		case errors.Is(err, errs.ErrStopped):
			return false, errs.UnknownOutcome(mb.host.StoppedErr())
		case ctx.Err() != nil:
			return false, errs.UnknownOutcome(mb.host.ProposeErr(ctx, ctx.Err()))
		case err != nil:
			return false, nil // d passed: propose again
		}
	}
}

// waitConfApplied waits (briefly) until no conf change is between the applied index and the end of the
// leader's log, so that raft does not drop the next one, and refuses the change if one stays pending.
func (mb *Members) waitConfApplied(ctx context.Context) error {
	deadline := time.Now().Add(2 * mb.cfg.ElectionTimeout)
	for {
		pending, err := mb.confChangePending()
		if err != nil || !pending {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: a membership change is still being applied; retry", errs.ErrMembershipRefused)
		}
		wctx, cancel := context.WithTimeout(ctx, mb.cfg.ElectionTimeout)
		err = mb.host.WaitApplied(wctx, mb.host.AppliedIndex()+1)
		cancel()
		if ctx.Err() != nil || errors.Is(err, errs.ErrStopped) {
			return errors.Join(ctx.Err(), err)
		}
	}
}

// confChangePending reports whether the log holds a conf change not applied yet.
func (mb *Members) confChangePending() (bool, error) {
	st, ok := mb.logIndex.(raft.Storage)
	if !ok {
		return false, nil
	}
	applied := mb.host.AppliedIndex()
	last, err := st.LastIndex()
	if err != nil || last <= applied {
		return false, err
	}
	ents, err := st.Entries(applied+1, last+1, math.MaxUint64)
	if err != nil {
		if errors.Is(err, raft.ErrCompacted) || errors.Is(err, raft.ErrUnavailable) {
			return false, nil
		}
		return false, err
	}
	for _, e := range ents {
		if e.GetType() != raftpb.EntryType_EntryNormal {
			return true, nil
		}
	}
	return false, nil
}

// Add adds a learner named name at peerAddr (and clientAddr, which may be empty).
func (mb *Members) Add(ctx context.Context, name, peerAddr, clientAddr string) (*leasepb.Member, error) {
	if err := validMemberAddrs(name, peerAddr, clientAddr); err != nil {
		return nil, err
	}
	if !mb.host.IsLeader() {
		return nil, mb.host.NotLeaderErr()
	}
	m := &leasepb.Member{Name: name, PeerAddr: peerAddr, ClientAddr: clientAddr, IsLearner: true}
	mb.host.ReadFSM(func(sm *fsm.FSM) { m.Id, _ = nextIncarnation(sm, mb.clusterID, name) })
	check := func() (refusal error) {
		mb.host.ReadFSM(func(sm *fsm.FSM) {
			if id, err := nextIncarnation(sm, mb.clusterID, name); err != nil || id != m.Id {
				refusal = cmp.Or(err, fmt.Errorf("%w: %q was added or removed meanwhile; retry", errs.ErrMembershipRefused, name))
				return
			}
			refusal = checkNewMember(sm, m)
		})
		return refusal
	}
	if err := check(); err != nil { // answer at once, without waiting for the semaphore
		return nil, err
	}
	err := mb.changeMembers(ctx, raftpb.ConfChangeType_ConfChangeAddLearnerNode, m, check, func(sm *fsm.FSM) bool { return sm.Member(m.Id) != nil })
	return m, err
}

func validMemberAddrs(name, peerAddr, clientAddr string) error {
	if err := validName("name", name, maxMemberName); err != nil {
		return err
	}
	if !ValidAdvertise(peerAddr) {
		return errs.Invalid("peer_addr", "%q is not a host:port other nodes can dial (not 0.0.0.0, [::] or port 0)", peerAddr)
	}
	if clientAddr != "" && !ValidAdvertise(clientAddr) {
		return errs.Invalid("client_addr", "%q is not a host:port clients can dial (not 0.0.0.0, [::] or port 0)", clientAddr)
	}
	return nil
}

// maxMemberName bounds a member's name (docs/design.md, "Limits").
const maxMemberName = 64

// nextIncarnation is the raft id a member called name is added under: its first incarnation the cluster
// has not retired. A removed name may thus be added again, under a new id (server/internal/ids).
func nextIncarnation(sm *fsm.FSM, cluster uint64, name string) (uint64, error) {
	for k := range ids.MaxIncarnations {
		if id := ids.Incarnation(cluster, name, k); !sm.WasRemoved(id) {
			return id, nil
		}
	}
	return 0, fmt.Errorf("%w: %q was removed %d times, the limit of raft ids one name can have", errs.ErrMembershipRefused, name, ids.MaxIncarnations)
}

// nameRemoved reports whether a member called name was ever removed (its founding id is retired first).
func nameRemoved(sm *fsm.FSM, cluster uint64, name string) bool {
	return sm.WasRemoved(ids.Member(cluster, name))
}

// checkNewMember refuses a member whose name, id or addresses the cluster already has.
func checkNewMember(sm *fsm.FSM, m *leasepb.Member) error {
	if sm.WasRemoved(m.Id) {
		return fmt.Errorf("%w: raft id %s was retired", errs.ErrMembershipRefused, leasepb.FormatID(m.Id))
	}
	for _, o := range sm.Members() {
		switch {
		case o.GetName() == m.Name || o.GetId() == m.Id:
			return fmt.Errorf("%w: %q (id %s) is already a member", errs.ErrMemberExists, m.Name, leasepb.FormatID(o.GetId()))
		case sameAddr(o.GetPeerAddr(), m.PeerAddr):
			return fmt.Errorf("%w: member %q already has peer address %s", errs.ErrMemberExists, o.GetName(), m.PeerAddr)
		case m.ClientAddr != "" && sameAddr(o.GetClientAddr(), m.ClientAddr):
			return fmt.Errorf("%w: member %q already has client address %s", errs.ErrMemberExists, o.GetName(), m.ClientAddr)
		}
	}
	return nil
}

func sameAddr(a, b string) bool {
	if a == "" || b == "" {
		return false
	}
	ah, ap, err1 := net.SplitHostPort(a)
	bh, bp, err2 := net.SplitHostPort(b)
	if err1 != nil || err2 != nil {
		return a == b
	}
	return ap == bp && (ah == bh || (net.ParseIP(ah) != nil && net.ParseIP(ah).Equal(net.ParseIP(bh))))
}

// Promote makes learner id a voter, if it has caught up with the leader's log.
func (mb *Members) Promote(ctx context.Context, id uint64) error {
	if !mb.host.IsLeader() {
		return mb.host.NotLeaderErr()
	}
	m := mb.Member(id)
	if m == nil {
		return fmt.Errorf("%w: %s", errs.ErrMemberNotFound, leasepb.FormatID(id))
	}
	check := func() error {
		m := mb.Member(id)
		switch {
		case m == nil:
			return fmt.Errorf("%w: %s", errs.ErrMemberNotFound, leasepb.FormatID(id))
		case !m.GetIsLearner():
			return fmt.Errorf("%w: %s (%s) is already a voter", errs.ErrMembershipRefused, m.GetName(), leasepb.FormatID(id))
		}
		if match, last, ok := mb.learnerProgress(id); !ok || !caughtUp(match, last) {
			return fmt.Errorf("%w: learner %s has not caught up (its log is at %d, the leader's at %d; within %d to promote)",
				errs.ErrMembershipRefused, m.GetName(), match, last, promoteLag)
		}
		return nil
	}
	if err := check(); err != nil { // answer at once, without waiting for the semaphore
		return err
	}
	return mb.changeMembers(ctx, raftpb.ConfChangeType_ConfChangeAddNode, m, check,
		func(sm *fsm.FSM) bool { return !sm.Member(id).GetIsLearner() })
}

// caughtUp reports whether a log that the leader knows to reach match is close enough to the leader's last
// index to vote without slowing commits. A match of 0 means the learner never answered.
func caughtUp(match, last uint64) bool { return match > 0 && match+promoteLag >= last }

// learnerProgress is how far the leader knows member id's log to reach, and the leader's last index.
func (mb *Members) learnerProgress(id uint64) (match, last uint64, ok bool) {
	st := mb.host.RaftStatus()
	pr, ok := st.Progress[id]
	self, selfOK := st.Progress[mb.id]
	if !ok || !selfOK || st.RaftState != raft.StateLeader {
		return 0, 0, false
	}
	return pr.Match, self.Match, true
}

// Remove takes member id out of the configuration. Removing the leader (this node) first hands
// leadership to the most caught-up voter and answers Unavailable with the new leader's hint: the client
// retries there, and the new leader removes this node.
func (mb *Members) Remove(ctx context.Context, id uint64) error {
	if !mb.host.IsLeader() {
		return mb.host.NotLeaderErr()
	}
	m := mb.Member(id)
	if m == nil {
		return fmt.Errorf("%w: %s", errs.ErrMemberNotFound, leasepb.FormatID(id))
	}
	if err := mb.checkRemoval(ctx, m); err != nil {
		return err
	}
	if id == mb.id {
		return mb.handOver(ctx)
	}
	check := func() error {
		if m := mb.Member(id); m == nil {
			return fmt.Errorf("%w: %s", errs.ErrMemberNotFound, leasepb.FormatID(id))
		}
		return mb.checkRemoval(ctx, m)
	}
	return mb.changeMembers(ctx, raftpb.ConfChangeType_ConfChangeRemoveNode, m, check, func(sm *fsm.FSM) bool { return sm.Member(id) == nil })
}

// checkRemoval refuses to remove the last voter, or a voter whose removal leaves too few active voters
// for a quorum of the new configuration. A leader learns who is active only from their answers (its
// progress starts inactive at its election), so a shortfall is re-checked for two election timeouts.
func (mb *Members) checkRemoval(ctx context.Context, m *leasepb.Member) error {
	if m.GetIsLearner() {
		return nil
	}
	deadline := time.Now().Add(2 * mb.cfg.ElectionTimeout)
	tick := time.NewTicker(mb.cfg.TickInterval)
	defer tick.Stop()
	for {
		voters, active := mb.votersAfterRemoval(m.GetId())
		switch {
		case voters == 0:
			return fmt.Errorf("%w: %s is the last voter; a cluster cannot remove its last voter", errs.ErrMembershipRefused, m.GetName())
		case active >= voters/2+1:
			return nil
		case time.Now().After(deadline):
			return fmt.Errorf("%w: removing %s leaves %d voters of which only %d are active, short of a quorum",
				errs.ErrMembershipRefused, m.GetName(), voters, active)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// votersAfterRemoval counts the voters other than id, and those of them the leader heard from recently.
func (mb *Members) votersAfterRemoval(id uint64) (voters, active int) {
	for vid, pr := range mb.host.RaftStatus().Progress {
		if pr.IsLearner || vid == id {
			continue
		}
		voters++
		if vid == mb.id || pr.RecentActive {
			active++
		}
	}
	return voters, active
}

// handOver transfers leadership to the most caught-up voter and waits for a new leader, asking again
// when raft gives up on a transfer (after an election timeout), within the proposal timeout.
func (mb *Members) handOver(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, mb.cfg.ProposalTimeout)
	defer cancel()
	tick := time.NewTicker(mb.cfg.TickInterval)
	defer tick.Stop()
	var asked time.Time
	for mb.host.IsLeader() || mb.host.LeaderID() == raft.None {
		if mb.host.IsLeader() && time.Since(asked) > 2*mb.cfg.ElectionTimeout {
			target := mb.transferTarget()
			if target == 0 {
				return fmt.Errorf("%w: no other voter to hand leadership to", errs.ErrMembershipRefused)
			}
			mb.log.Info("transferring leadership before this node's removal", "to", leasepb.FormatID(target))
			mb.host.TransferLeadership(ctx, target)
			asked = time.Now()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("leadership transfer before removal did not finish in time: %w", errs.ErrTimeout)
		case <-mb.host.Halted():
			return mb.host.StoppedErr()
		case <-tick.C:
		}
	}
	return fmt.Errorf("leadership handed to %s before removing this node; retry there: %w", leasepb.FormatID(mb.host.LeaderID()), errs.ErrNotLeader)
}

// transferTarget is the most caught-up voter other than this node (0: none).
func (mb *Members) transferTarget() uint64 {
	var target, best uint64
	for id, pr := range mb.host.RaftStatus().Progress {
		if id != mb.id && !pr.IsLearner && pr.Match >= best {
			target, best = id, pr.Match
		}
	}
	return target
}

// updateClientAddr records member m's new client address in the table.
func (mb *Members) updateClientAddr(ctx context.Context, m *leasepb.Member, addr string) error {
	u := proto.Clone(m).(*leasepb.Member)
	u.ClientAddr = addr
	return mb.changeMembers(ctx, raftpb.ConfChangeType_ConfChangeUpdateNode, u, nil,
		func(sm *fsm.FSM) bool {
			return sm.Member(m.GetId()) == nil || sm.Member(m.GetId()).GetClientAddr() == addr
		})
}

// AutoPromote runs on every node and acts while it leads: every raft tick it samples each learner's
// progress, and it promotes one that has been caught up and active for promoteAfter. It returns when ctx
// ends.
//
// It samples every tick, not every election timeout, because raft clears a follower's RecentActive at each
// of the leader's quorum checks (one per election timeout) and sets it again only when the next answer
// arrives, a heartbeat later. Sampled once per election timeout, the ticker and the quorum check keep the
// same phase, so an idle learner could be seen inactive at every sample for as long as the phase held
// (51 s in one soak). Sampled every tick, a live learner is seen active in most samples of every election
// timeout.
func (mb *Members) AutoPromote(ctx context.Context) {
	tick := time.NewTicker(mb.cfg.TickInterval)
	defer tick.Stop()
	learners := learnerTracker{activeWithin: mb.cfg.ElectionTimeout, promoteAfter: mb.cfg.promoteAfter(), slow: mb.logSlowLearner}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if !mb.host.IsLeader() {
			learners.reset()
			continue
		}
		st, now := mb.host.RaftStatus(), time.Now()
		if id, ok := learners.observe(mb.id, st, now); ok {
			if err := mb.Promote(ctx, id); err != nil {
				mb.log.Info("automatic promotion did not happen", "member", leasepb.FormatID(id), "err", err)
			} else {
				mb.log.Info("promoted a caught-up learner", "member", leasepb.FormatID(id))
			}
			learners.restart(id)
		}
	}
}

// logSlowLearner logs a learner left unpromoted (learnerTracker.slow).
func (mb *Members) logSlowLearner(id uint64, pr tracker.Progress, last uint64, unpromotedFor time.Duration) {
	mb.log.Warn("learner not promoted yet", "member", leasepb.FormatID(id), "for", unpromotedFor.Round(time.Second),
		"match", pr.Match, "leader_last", last, "recent_active", pr.RecentActive, "state", pr.State.String(),
		"caught_up", caughtUp(pr.Match, last))
}
