package server

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server/internal/auth"
	"github.com/leased/leased/server/internal/leases"
	"github.com/leased/leased/server/internal/lessor"
	"github.com/leased/leased/server/internal/membership"
	"github.com/leased/leased/server/internal/raftnode"
	"github.com/leased/leased/server/internal/rpc"
	"github.com/leased/leased/server/internal/waitq"
	"github.com/leased/leased/server/internal/watch"
)

// peerTransport is what the node needs of the peer transport (server/transport implements it;
// server/internal/sim's in-memory network in simulations).
type peerTransport interface {
	Send(msgs []*raftpb.Message)
	AddPeer(id uint64, addr string)
	RemovePeer(id uint64)
	PeerClient(id uint64) (wirepb.RaftClient, bool)
}

// logStore is what the node needs of its raft log beyond what raft reads (raftlog.Storage implements it;
// sim.Storage in simulations).
type logStore interface {
	Save(hs *raftpb.HardState, ents []*raftpb.Entry, snap *raftpb.Snapshot) error
	CreateSnapshot(i uint64, cs *raftpb.ConfState, data []byte) (*raftpb.Snapshot, error)
	Compact(compactIndex uint64) error
	Size() int64
	Close() error
}

// logIndexer is the part of raft.Storage that tells how many entries the log holds.
type logIndexer interface {
	FirstIndex() (uint64, error)
	LastIndex() (uint64, error)
}

// node owns the raft node, the state machine and everything that reacts to applied entries. One goroutine
// (run) owns the raft Ready loop and raft itself; gRPC handlers talk to it through proposals, ReadIndex
// and the FSM lock.
type node struct {
	cfg       Config
	log       *slog.Logger
	audit     *auth.AuditTrail // the audit trail's lines, written off the loop
	authz     *auth.Authorizer
	clock     Clock
	id        uint64
	clusterID uint64
	storage   logStore
	logIndex  logIndexer // the raft log's first and last index, for leased_raft_log_entries
	// host runs raft on the Ready loop (rafthost.go); raft is how other goroutines reach it (host, or a
	// test's stand-in).
	host      *raftHost
	raft      raftControl
	transport peerTransport
	// notices holds the appends that only carry a new commit index to a follower (raftnode.CommitNotices).
	notices *raftnode.CommitNotices

	// state owns the state machine: the Ready loop hands it committed entries, the rest reads through it
	// (internal/leases).
	state *leases.State

	proposals *proposalWaiter
	reads     *readIndexer
	lessor    *lessor.Lessor
	queue     *waitq.Queue
	watch     *watch.Hub
	metrics   *metrics
	// ops serves the client requests (internal/rpc; wired in leaseops.go).
	ops *rpc.LeaseOps

	// status, updated by the Ready loop.
	leader atomic.Uint64
	// leaderSwitch wakes forwarded writes when leader changes (forwardFollowing).
	leaderSwitch leaderSwitch
	// lastLeader is the last non-zero leader this node knew (Ready loop only), for leader changes.
	lastLeader uint64
	term       atomic.Uint64
	commit     atomic.Uint64
	role       atomic.Int32
	confState  *raftpb.ConfState
	// snapshots takes the node's snapshots off the Ready loop (raftnode.Snapshotter).
	snapshots *raftnode.Snapshotter
	// unsyncedHS is a HardState raft did not need synced (only the commit moved), not yet written.
	unsyncedHS *raftpb.HardState
	// local plays raft's local storage threads: the log append and the apply (raftnode.LocalStorage).
	local *raftnode.LocalStorage[*fsm.FSM]

	// peerIn checks the messages peers send before raft sees them (peerinput.go).
	peerIn *peerGate
	// terms bounds the peer terms this node accepts (raftnode.TermGuard); it follows term.
	terms *raftnode.TermGuard

	// clientAddr and peerAddr are this node's advertised addresses.
	clientAddr, peerAddr string
	// leaderLoss acts on the transport's hint that a peer's stream broke (internal/raftnode).
	leaderLoss *raftnode.LeaderLoss
	// members keeps the member table, raft's configuration and the transport's peers in step, and
	// makes membership changes (internal/membership).
	members *membership.Members

	// lastTick is when the Ready loop last ticked, as an offset on the node's clock from tickBase plus
	// one (0: the loop has not started), for any goroutine: a long gap is a stall, which the lessor
	// makes up for (decision 3) and during which a leader does not claim to lead (loopStalled). An
	// offset between two readings of the clock, so a step of the wall clock is no stall.
	tickBase time.Time
	lastTick atomic.Int64
	ticks    atomic.Uint64 // for tests that wait for the loop to have run
	restores atomic.Uint64 // snapshots received from a leader and restored
	stopped  chan struct{}
	// draining closes when the node begins to shut down (Server.Close): Writes streams tell their clients.
	draining chan struct{}
	// done closes when the node stops serving: its Ready loop ended (Close, a failed write), or the disk
	// watchdog gave up on a stalled write while the loop is still blocked in it.
	done     chan struct{}
	haltOnce sync.Once
	fatalErr atomic.Pointer[error]

	// watchdog times the raft log writes in flight (the Ready loop's and the snapshotter's) and stops
	// the node on a stalled one (watchdog.go).
	watchdog *raftnode.Watchdog
	disk     *diskStats // the log's size and the volume's free space, for readers that must not wait (diskstats.go)
	faults   diskFaults // injected stalls; empty unless built with -tags faultinject
	hooks    testHooks  // set only by tests (export_test.go)
}

// run is the Ready loop: it takes in what is queued for raft (ticks, peer messages, proposals, calls;
// raftHost), then handles every Ready that makes: send, apply, persist (handleReady). It returns when
// stop is closed or on a fatal error (a failed disk write: nothing unpersisted may be acted on).
func (n *node) run(stop <-chan struct{}) {
	defer n.halt()
	defer n.audit.Close()
	ticker := time.NewTicker(n.cfg.TickInterval)
	defer ticker.Stop()
	n.ticked(n.clock.Now())
	h := n.host
	for {
		// Proposals wait in their queue while raft knows no leader: it would drop them.
		props := h.proposals
		if n.leader.Load() == raft.None {
			props = nil
		}
		select {
		case <-stop:
			n.flushOnStop()
			return
		case <-ticker.C:
			n.tick()
		case res := <-n.snapshots.Results():
			if err := n.snapshots.Taken(res); err != nil {
				n.fail(err)
				return
			}
		case p := <-props:
			h.pending = append(h.pending, p)
		case m := <-h.messages:
			h.stepMessage(m)
		case fn := <-h.calls:
			fn(h.rn)
		case <-n.notices.Due():
			n.transport.Send(n.notices.Release())
		}
		h.intake(props != nil)
		if err := n.handleReadys(); err != nil {
			n.fail(err)
			return
		}
	}
}

// handleReadys handles Readys until raft has none: the responses a Ready's writes step back (a leader's
// own acknowledgement, say) make the next one.
func (n *node) handleReadys() error {
	for n.host.rn.HasReady() {
		if err := n.handleReady(n.host.rn.Ready()); err != nil {
			return err
		}
	}
	return nil
}

// tick advances raft's logical clock and the lessor. A gap much longer than the tick means this loop
// could not run (a blocked disk, a paused process): the lessor extends every deadline by it, so clients
// are not punished for the server's stall.
func (n *node) tick() {
	now := n.clock.Now()
	if gap := n.sinceTick(now) - n.cfg.TickInterval; gap > stallThreshold(n.cfg.TickInterval) {
		n.log.Warn("ready loop stalled; extending lease deadlines", "stall", gap)
		n.lessor.Extend(gap)
	}
	n.ticked(now)
	n.ticks.Add(1)
	n.host.rn.Tick()
	n.lessor.Tick(now)
}

// ticked records that the loop ticked at now.
func (n *node) ticked(now time.Time) { n.lastTick.Store(int64(now.Sub(n.tickBase)) + 1) }

// sinceTick is the time from the loop's last tick to now (0 before the loop started).
func (n *node) sinceTick(now time.Time) time.Duration {
	last := n.lastTick.Load()
	if last == 0 {
		return 0
	}
	return now.Sub(n.tickBase) - time.Duration(last-1)
}

// loopStalled is how long the Ready loop has not ticked, once that is longer than an election timeout;
// 0 while it ticks. Any goroutine may ask.
func (n *node) loopStalled() time.Duration {
	if gap := n.sinceTick(n.clock.Now()); gap > n.cfg.ElectionTimeout() {
		return gap
	}
	return 0
}

// knownLeader is the leader this node tells others of (response headers, Status, the member table,
// readiness): the one raft knows, except that a leader whose loop has stalled for an election timeout
// (a blocked disk write) names none. It cannot act as leader until the loop runs again, and its peers
// have likely elected another meanwhile; while it still named itself, it answered Status faster than
// the busy new leader and kept clients' discovery pointed at it until their leases ran out.
func (n *node) knownLeader() uint64 {
	leader := n.leader.Load()
	if leader == n.id && n.loopStalled() > 0 {
		return raft.None
	}
	return leader
}

func stallThreshold(tick time.Duration) time.Duration {
	return max(4*tick, 50*time.Millisecond)
}

// fail records the node's fatal error (the first one: what follows from it says less) and logs it.
func (n *node) fail(err error) {
	if n.fatalErr.CompareAndSwap(nil, &err) {
		n.log.Error("node stopping after a fatal error", "err", err)
	}
}

// halt stops the node serving: everything waiting on done gives up with stoppedErr.
func (n *node) halt() { n.haltOnce.Do(func() { close(n.done) }) }

// handleReady handles one Ready. Raft runs with asynchronous storage writes (startRaft): the log write
// and the apply come as two messages in rd.Messages, to raft's LocalAppendThread and LocalApplyThread,
// each carrying the responses to deliver once it is done (raftnode.LocalStorage). The messages to peers go out
// first, so the followers write new entries while this node writes them too; a leader's own
// acknowledgement of them is one of the append's responses, stepped back into raft only once its write
// is durable, so it counts itself toward a commit only then (decision 8). A follower's acknowledgement to
// the leader is another: it leaves only after the follower's write. The apply, then the append, run here
// on the loop; the loop takes the next Ready only after both.
func (n *node) handleReady(rd raft.Ready) error {
	if rd.HardState != nil && !raft.IsEmptyHardState(rd.HardState) {
		n.term.Store(rd.HardState.GetTerm())
		n.terms.Observe(rd.HardState.GetTerm())
		n.commit.Store(rd.HardState.GetCommit())
	}
	if rd.SoftState != nil {
		n.updateSoftState(rd.SoftState)
	}
	appendMsg, applyMsg, peerMsgs := raftnode.SplitLocal(rd.Messages)
	if appendMsg != nil {
		// Peers may acknowledge these entries before this node's write of them returns: the peer checks
		// count them as part of the log (peerView.lastIndex).
		n.local.Begin(appendMsg)
	}
	n.transport.Send(n.notices.Filter(peerMsgs))
	// The apply first: its entries are committed and already durable here (raft hands out for apply only
	// what an earlier append made stable), so their clients need not wait for this Ready's write too.
	if applyMsg != nil {
		if err := n.local.Apply(applyMsg); err != nil {
			return err
		}
	}
	if appendMsg != nil {
		if err := n.local.Append(appendMsg, rd.MustSync); err != nil {
			return err
		}
	}
	for _, rs := range rd.ReadStates {
		n.reads.deliver(rs)
	}
	return n.snapshots.Maybe()
}

// persist makes a log append durable before anything acts on it (decision 8): one bbolt transaction.
// An append that raft says needs no sync (mustSync false: no entries, and only the commit index moved)
// is not written at all: a stale commit index on disk is safe, since committed entries are learned again
// from the leader after a restart, and its responses attest nothing this write would add (the entries
// they acknowledge were made durable by earlier appends, which the loop finished in order). The newest
// such HardState is kept and written with the next Save, and always before a snapshot (raft refuses to
// restart with a commit index below its snapshot).
func (n *node) persist(hs *raftpb.HardState, ents []*raftpb.Entry, snap *raftpb.Snapshot, mustSync bool) error {
	if !mustSync && len(ents) == 0 && snap == nil {
		if hs != nil && !raft.IsEmptyHardState(hs) {
			n.unsyncedHS = hs
		}
		return nil
	}
	if (hs == nil || raft.IsEmptyHardState(hs)) && n.unsyncedHS != nil {
		hs = n.unsyncedHS
	}
	start := time.Now()
	if err := n.watchdog.Write("save", func() error { return n.storage.Save(hs, ents, snap) }); err != nil {
		return fmt.Errorf("persist ready: %w", err)
	}
	n.metrics.fsyncSeconds.Observe(since(start))
	n.unsyncedHS = nil
	if len(ents) > 0 || snap != nil {
		n.updateLogEntries()
	}
	return nil
}

// updateLogEntries sets leased_raft_log_entries from the log's first and last index.
func (n *node) updateLogEntries() {
	if n.logIndex == nil {
		return
	}
	first, err1 := n.logIndex.FirstIndex()
	last, err2 := n.logIndex.LastIndex()
	if err1 == nil && err2 == nil && last+1 >= first {
		n.metrics.logEntries.Set(float64(last + 1 - first))
	}
}

// flushOnStop writes, as the loop ends, the HardState that persist held back.
func (n *node) flushOnStop() {
	if err := n.flushHardState(); err != nil {
		n.log.Warn("could not persist the last commit index", "err", err)
	}
}

// flushHardState writes a HardState that persist held back.
func (n *node) flushHardState() error {
	if n.unsyncedHS == nil {
		return nil
	}
	start := time.Now()
	if err := n.watchdog.Write("save", func() error { return n.storage.Save(n.unsyncedHS, nil, nil) }); err != nil {
		return fmt.Errorf("persist hard state: %w", err)
	}
	n.metrics.fsyncSeconds.Observe(since(start))
	n.unsyncedHS = nil
	return nil
}

func (n *node) updateSoftState(ss *raft.SoftState) {
	wasLeader := n.isLeader()
	// A change to a new, known leader (as etcd counts them): losing sight of the leader is not one.
	if ss.Lead != raft.None && ss.Lead != n.lastLeader {
		n.metrics.leaderChanges.Inc()
		n.lastLeader = ss.Lead
	}
	n.role.Store(int32(ss.RaftState))
	if n.leader.Swap(ss.Lead) != ss.Lead {
		// Last, once the role and the lessor are the new leader's: a woken forward may serve here at once.
		defer n.leaderSwitch.changed()
	}
	isLeader := ss.RaftState == raft.StateLeader
	switch {
	case isLeader && !wasLeader:
		n.log.Info("became leader", "term", n.term.Load())
		n.lessor.Promote(n.clock.Now(), n.term.Load())
		n.proposeInitialACL()
	case !isLeader && wasLeader:
		n.log.Info("lost leadership", "leader", leasepb.FormatID(ss.Lead))
		n.lessor.Demote()
		n.notices.Forget() // the followers learn the commit index from the next leader
		n.queue.FailAll(ErrNotLeader)
		// Entries this node proposed may be lost or may commit under the next leader: tell their callers
		// now rather than at their timeout, so clients retry at once (Acquire's request id, and Release's
		// and Renew's token, make a retry safe).
		lost := fmt.Errorf("leadership lost before the entry applied, %w: %w", ErrOutcomeUnknown, ErrNotLeader)
		n.proposals.failAll(lost)
		n.ops.FailCarried(lost) // the blocking acquires a release's entry carried
	}
}

func (n *node) isLeader() bool { return raft.StateType(n.role.Load()) == raft.StateLeader }

// restoreSnapshot replaces the state machine with sm, decoded from a snapshot received from the leader.
func (n *node) restoreSnapshot(snap *raftpb.Snapshot, sm *fsm.FSM) error {
	sm.SetClusterID(n.clusterID)
	n.state.Replace(sm)
	n.members.SyncPeers() // the member table came with the snapshot
	if sm.WasRemoved(n.id) {
		return n.members.Removed(snap.GetMetadata().GetIndex())
	}
	n.confState = snap.GetMetadata().GetConfState()
	index := snap.GetMetadata().GetIndex()
	n.snapshots.Restored(index)
	n.state.Restored(index)
	n.restores.Add(1)
	n.metrics.snapBytes.Set(float64(len(snap.GetData())))
	n.updateLogEntries()
	n.log.Info("restored snapshot", "index", index, "leases", sm.Len())
	return nil
}
