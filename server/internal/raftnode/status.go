package raftnode

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/leased/leased/server/internal/errs"
)

// What any goroutine may ask of the node: its raft status as the loop last stored it, and whether it
// still serves.

// errLeadershipLost is what proposers still waiting hear when this node stops leading.
var errLeadershipLost = fmt.Errorf("leadership lost before the entry applied, %w: %w", errs.ErrOutcomeUnknown, errs.ErrNotLeader)

// Leader is the leader raft knows (0: none).
func (n *Node) Leader() uint64 { return n.leader.Load() }

// Term is the node's current raft term.
func (n *Node) Term() uint64 { return n.term.Load() }

// Commit is the node's raft commit index.
func (n *Node) Commit() uint64 { return n.commit.Load() }

// Role is raft's state: leader, follower, candidate.
func (n *Node) Role() raft.StateType { return raft.StateType(n.role.Load()) }

// IsLeader reports whether this node leads.
func (n *Node) IsLeader() bool { return n.Role() == raft.StateLeader }

// LeaderChanged is a channel closed when the leader this node knows next changes (a new leader, or
// losing sight of one).
func (n *Node) LeaderChanged() <-chan struct{} { return n.leaderSwitch.next() }

// LoopStalled is how long the Ready loop has not ticked, once that is longer than an election timeout;
// 0 while it ticks.
func (n *Node) LoopStalled() time.Duration {
	if gap := n.lastTick.since(n.cfg.Clock.Now()); gap > n.cfg.ElectionTimeout() {
		return gap
	}
	return 0
}

// KnownLeader is the leader this node tells others of (response headers, Status, the member table,
// readiness): the one raft knows, except that a leader whose loop has stalled for an election timeout
// (a blocked disk write) names none. It cannot act as leader until the loop runs again, and its peers
// have likely elected another meanwhile; while it still named itself, it answered Status faster than
// the busy new leader and kept clients' discovery pointed at it until their leases ran out.
func (n *Node) KnownLeader() uint64 {
	leader := n.leader.Load()
	if leader == n.cfg.ID && n.LoopStalled() > 0 {
		return raft.None
	}
	return leader
}

// Ticks is how many times the loop has ticked; Restores how many snapshots from a leader it restored.
func (n *Node) Ticks() uint64    { return n.ticks.Load() }
func (n *Node) Restores() uint64 { return n.restores.Load() }

// Watchdog is the disk watchdog of the node's raft log writes.
func (n *Node) Watchdog() *Watchdog { return n.watchdog }

// NextSnapshotAt is the applied index at which this node, whose last snapshot is at index with
// configuration cs, takes its next one (Snapshotter.NextAt).
func (n *Node) NextSnapshotAt(index uint64, cs *raftpb.ConfState) uint64 {
	return n.snapshots.NextAt(index, cs)
}

// AcceptTerm reports whether a peer message at term may reach raft (TermGuard.AcceptTerm).
func (n *Node) AcceptTerm(term uint64) bool { return n.terms.AcceptTerm(term) }

// LogEnd is the last index in the log: the durable log's, or the append in flight's, whose entries a
// leader sends its followers while it writes them (so their acknowledgements may arrive first). 0 once
// the log is closed.
func (n *Node) LogEnd() uint64 {
	// The append in flight first: once it is 0, its write returned and the log has its entries.
	appending := n.local.Appending()
	last, err := n.cfg.Storage.LastIndex()
	if err != nil {
		return 0
	}
	return max(last, appending)
}

// StreamLost is the transport's hint that a peer's stream broke (LeaderLoss.StreamLost).
func (n *Node) StreamLost(peer uint64) { n.leaderLoss.StreamLost(peer) }

// Stop tells the node to stop: writes the disk watchdog holds give up. Run ends once its stop closes.
func (n *Node) Stop() { close(n.stopped) }

// Done closes when the node stops serving: its loop ended, or the disk watchdog gave up on a stalled write.
func (n *Node) Done() <-chan struct{} { return n.done }

// Err is the fatal error that stopped the node, if any.
func (n *Node) Err() error {
	if p := n.fatalErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Fail records the node's fatal error (the first one: what follows from it says less) and logs it.
func (n *Node) Fail(err error) {
	if n.fatalErr.CompareAndSwap(nil, &err) {
		n.log.Error("node stopping after a fatal error", "err", err)
	}
}

// Halt stops the node serving: everything waiting on Done gives up with StoppedErr.
func (n *Node) Halt() { n.haltOnce.Do(func() { close(n.done) }) }

// StoppedErr is errs.ErrStopped (with the fatal error, if any) once the node stops or is told to; nil
// while it serves.
func (n *Node) StoppedErr() error {
	if p := n.fatalErr.Load(); p != nil {
		return fmt.Errorf("%w: %v", errs.ErrStopped, *p)
	}
	select {
	case <-n.stopped:
		return errs.ErrStopped
	case <-n.done:
		return errs.ErrStopped
	default:
		return nil
	}
}

// NotLeaderErr is the refusal of a node that does not lead: errs.ErrNoLeader if it knows no leader.
func (n *Node) NotLeaderErr() error {
	if n.leader.Load() == raft.None {
		return errs.ErrNoLeader
	}
	return errs.ErrNotLeader
}

// ProposeErr maps what stopped a proposal whose context is ctx to the error its proposer gets.
func (n *Node) ProposeErr(ctx context.Context, err error) error {
	switch {
	case errors.Is(err, raft.ErrProposalDropped):
		return fmt.Errorf("proposal dropped: %w", errs.ErrNoLeader)
	case errors.Is(err, raft.ErrStopped):
		return errs.ErrStopped
	case ctx.Err() != nil && n.leader.Load() == raft.None:
		return fmt.Errorf("waiting for a leader: %w", errs.ErrNoLeader)
	case ctx.Err() != nil:
		return fmt.Errorf("proposal not applied in time: %w", errs.ErrTimeout)
	}
	return err
}
