package raftnode

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/leased/leased/api/leasepb"
)

// Applier is the layer above raft: the lease service. The Ready loop hands it the committed entries,
// and the snapshots from the leader to restore; the snapshots this node takes freeze its state.
type Applier interface {
	// Apply applies committed entries, in order; an error stops the node.
	Apply(ents []*raftpb.Entry) error
	// Decode decodes a snapshot's data, before the snapshot is persisted: data that does not decode stops
	// the node now rather than on every restart. The Restore it returns makes the decoded state the
	// node's, once the snapshot is durable.
	Decode(data []byte) (Restore, error)
	// Applied is the index of the last entry applied; WaitApplied returns once the entry at index is,
	// or ctx's error, or errs.ErrStopped once stopped closes.
	Applied() uint64
	WaitApplied(ctx context.Context, index uint64, stopped <-chan struct{}) error
	// Freeze returns the state frozen at its applied index, for a snapshot: what the snapshot covers
	// must be done with first (the audit lines of its entries).
	Freeze() SnapshotView
}

// Restore makes a decoded snapshot's state the node's (Applier.Decode); an error stops the node.
type Restore func(snap *raftpb.Snapshot) error

// Handler hears, on the Ready loop, of what raft's state means for the layer above (as etcd's
// raftReadyHandler): leadership won and lost, and the loop's ticks. Each func may be nil.
type Handler struct {
	// Tick runs at every tick. stalled is how much longer than the tick the loop could not run (a
	// blocked disk, a paused process), once that is well past the tick; else 0.
	Tick func(now time.Time, stalled time.Duration)
	// BecameLeader runs when this node wins an election in term; LostLeadership when it stops leading.
	// Proposers still waiting are failed right after LostLeadership.
	BecameLeader   func(term uint64)
	LostLeadership func()
	// Stopped runs as the loop ends: nothing is applied from then on.
	Stopped func()
}

// Proposers are those waiting for their proposals (Waiter): raft's refusal of one, and the loss of
// leadership, reach them from the loop.
type Proposers interface {
	Refuse(id uint64, err error)
	FailAll(err error)
}

// LogWriter is the raft log's write side (raftlog.Storage; an in-memory log in simulations).
type LogWriter interface {
	Save(hs *raftpb.HardState, ents []*raftpb.Entry, snap *raftpb.Snapshot) error
	SnapshotStorage
}

// Config is what a Node needs: raft's settings, its log, and the layer above.
type Config struct {
	ID                            uint64
	TickInterval                  time.Duration
	ElectionTicks, HeartbeatTicks int
	// ProposalTimeout bounds a proposal's wait to apply; DiskStallTimeout a raft log write (Watchdog).
	ProposalTimeout, DiskStallTimeout time.Duration
	// SnapshotEntries and SnapshotCatchUp: SnapshotterConfig's Entries and CatchUp.
	SnapshotEntries, SnapshotCatchUp uint64
	Clock                            Clock
	Log                              *slog.Logger

	// Storage is what raft reads of the log; Writer writes it. Snapshot is the log's snapshot as the node
	// starts (its state is the applier's).
	Storage  raft.Storage
	Writer   LogWriter
	Snapshot *raftpb.Snapshot
	// DiskPath names the file a raft log write of kind op writes, for errors; BeforeWrite runs before
	// each (WatchdogConfig).
	DiskPath    func(op string) string
	BeforeWrite func(stop <-chan struct{}, path func() string) error

	Applier   Applier
	Handler   Handler
	Proposers Proposers
	// Send hands messages to the peer transport.
	Send func(msgs []*raftpb.Message)
	// IsMember tells the members from whom peer messages are taken, and CheckSnapshot whether a
	// snapshot's data agrees with the metadata raft acts on (the layer above decodes it): an error
	// drops the MsgSnap (PeerView).
	IsMember      func(id uint64) bool
	CheckSnapshot func(s *raftpb.Snapshot, self, from uint64) error
	// Dropped counts a peer message refused (PeerDropReasons); may be nil.
	Dropped func(reason string, count int)
	// Registerer gets the loop's metrics (NewMetrics); nil: not registered.
	Registerer prometheus.Registerer
}

// ElectionTimeout is ElectionTicks ticks.
func (c *Config) ElectionTimeout() time.Duration {
	return time.Duration(c.ElectionTicks) * c.TickInterval
}

// Node is the Ready loop over raft's RawNode: it persists, sends, applies (through Applier), takes
// snapshots, serves ReadIndex rounds, and tells the layer above of leadership (Handler). One goroutine
// (Run) owns the loop and raft itself; the others reach raft through the raft host's calls, which queue
// work for it (host.go).
type Node struct {
	// raftHost holds the RawNode (from StartRaft on); its calls (Propose, Step, Campaign, Status, ...)
	// are the Node's.
	*raftHost
	cfg     Config
	log     *slog.Logger
	metrics *Metrics

	// status, updated by the Ready loop.
	leader atomic.Uint64
	// lastLeader is the last non-zero leader this node knew (loop only), for leader changes.
	lastLeader uint64
	term       atomic.Uint64
	commit     atomic.Uint64
	role       atomic.Int32
	confState  *raftpb.ConfState
	// leaderSwitch wakes whoever waits for the leader to change (LeaderChanged).
	leaderSwitch leaderSwitch
	// unsyncedHS is a HardState raft did not need synced (only the commit moved), not yet written.
	unsyncedHS *raftpb.HardState

	// notices holds the appends that only carry a new commit index to a follower (CommitNotices).
	notices *CommitNotices
	// snapshots takes the node's snapshots off the loop; local plays raft's local storage threads: the
	// log append and the apply.
	snapshots *Snapshotter
	local     *LocalStorage[Restore]
	// terms bounds the peer terms this node accepts; it follows term.
	terms *TermGuard
	// watchdog times the raft log writes in flight and stops the node on a stalled one.
	watchdog   *Watchdog
	leaderLoss *LeaderLoss
	reads      *readIndexer
	// peers is what the checks of peer messages read of the node (StepPeer).
	peers PeerView

	// lastTick is when the loop last ticked, for any goroutine: a long gap is a stall, which the layer
	// above makes up for (Handler.Tick) and during which a leader does not claim to lead (LoopStalled).
	lastTick lastTick
	ticks    atomic.Uint64 // for tests that wait for the loop to have run
	restores atomic.Uint64 // snapshots received from a leader and restored
	// stopped closes when the node is told to stop (Stop); done when it stops serving: its loop ended
	// (Stop, a failed write), or the disk watchdog gave up on a stalled write while the loop is still
	// blocked in it.
	stopped  chan struct{}
	done     chan struct{}
	haltOnce sync.Once
	fatalErr atomic.Pointer[error]
}

// New makes the node's loop, not yet its raft (StartRaft): the peer transport, made next, delivers to it.
func New(cfg Config) *Node {
	n := &Node{
		cfg: cfg, log: cfg.Log, metrics: NewMetrics(cfg.Registerer), lastTick: lastTick{base: cfg.Clock.Now()},
		confState: cfg.Snapshot.GetMetadata().GetConfState(), notices: NewCommitNotices(),
		stopped: make(chan struct{}), done: make(chan struct{}),
	}
	n.watchdog = NewWatchdog(WatchdogConfig{Path: cfg.DiskPath, BeforeWrite: cfg.BeforeWrite, Stop: n.stopped, Fatal: n.Err})
	n.snapshots = newSnapshotter(n)
	n.local = NewLocalStorage(LocalStorageConfig[Restore]{
		Persist: n.persist, Decode: cfg.Applier.Decode, Restore: n.restore,
		Apply: func(ents []*raftpb.Entry) error {
			start := time.Now()
			if err := cfg.Applier.Apply(ents); err != nil {
				return err
			}
			n.metrics.applySeconds.Observe(since(start))
			return nil
		},
		Deliver: func(resps []*raftpb.Message) { n.deliver(resps) },
	})
	n.leaderLoss = NewLeaderLoss(LeaderLossConfig{
		Self: cfg.ID, Election: cfg.ElectionTimeout(), Raft: n, Leader: n.leader.Load, IsLeader: n.IsLeader,
		Log: n.log, Forgot: n.metrics.leaderStreamLost.Inc,
	})
	n.peers = PeerView{
		Self: cfg.ID, IsMember: cfg.IsMember, LastIndex: n.LogEnd, AcceptTerm: n.AcceptTerm,
		CheckSnapshot: cfg.CheckSnapshot,
	}
	n.metrics.snapBytes.Set(float64(len(cfg.Snapshot.GetData())))
	n.updateLogEntries()
	if cfg.Registerer != nil {
		registerStatus(cfg.Registerer, n)
	}
	return n
}

// StartRaft makes the node's RawNode on its log, bootstrapped with peers on an empty log. The loop runs
// it once Run is called.
func (n *Node) StartRaft(peers []raft.Peer) error {
	rn, err := n.newRawNode(peers)
	if err != nil {
		return err
	}
	n.raftHost = newRaftHost(rn, n.cfg.ID, n.done, n.cfg.Proposers.Refuse)
	n.dropped, n.send = n.cfg.Dropped, n.cfg.Send
	n.reads = newReadIndexer(n.raftHost, n.cfg.ElectionTimeout(), n.done)
	return nil
}

// newSnapshotter returns n's snapshotter, whose log's snapshot is cfg.Snapshot.
func newSnapshotter(n *Node) *Snapshotter {
	return NewSnapshotter(SnapshotterConfig{
		Self: n.cfg.ID, Entries: n.cfg.SnapshotEntries, CatchUp: n.cfg.SnapshotCatchUp,
		Index: n.cfg.Snapshot.GetMetadata().GetIndex(), Storage: n.cfg.Writer, Watchdog: n.watchdog,
		Applied:   n.cfg.Applier.Applied,
		ConfState: func() *raftpb.ConfState { return n.confState },
		Prepare:   n.flushHardState,
		Freeze:    n.cfg.Applier.Freeze,
		Took: func(_ uint64, bytes int, took time.Duration) {
			n.metrics.snapSeconds.Observe(took.Seconds())
			n.metrics.snapBytes.Set(float64(bytes))
			n.updateLogEntries()
		},
		Log: n.log,
	})
}

// newRawNode makes the node's RawNode, bootstrapped with peers on an empty log.
func (n *Node) newRawNode(peers []raft.Peer) (*raft.RawNode, error) {
	storage := n.cfg.Storage
	c := &raft.Config{
		ID:                        n.cfg.ID,
		ElectionTick:              n.cfg.ElectionTicks,
		HeartbeatTick:             n.cfg.HeartbeatTicks,
		Storage:                   storage,
		Applied:                   n.cfg.Snapshot.GetMetadata().GetIndex(),
		MaxSizePerMsg:             1 << 20,
		MaxCommittedSizePerReady:  16 << 20,
		MaxUncommittedEntriesSize: 64 << 20,
		MaxInflightMsgs:           256,
		CheckQuorum:               true,
		PreVote:                   true,
		ReadOnlyOption:            raft.ReadOnlySafe,
		// The log write and the apply come as messages in the Ready (LocalStorage): a leader sends new
		// entries to its followers while it writes them itself, and counts its own acknowledgement only
		// once its write is durable (decision 8).
		AsyncStorageWrites: true,
		// A follower drops proposals instead of handing them to the leader: client writes are forwarded
		// by the lease service (one path), and the lessor's Expire and Checkpoint entries carry the
		// proposing leader's view (a remaining TTL) that must not reach the log from a node that stopped
		// leading.
		DisableProposalForwarding: true,
		Logger:                    NewRaftLogger(n.log),
	}
	last, err := storage.LastIndex()
	if err != nil {
		return nil, fmt.Errorf("read last index: %w", err)
	}
	hs, _, err := storage.InitialState()
	if err != nil {
		return nil, fmt.Errorf("read initial state: %w", err)
	}
	// The persisted term, until raft's first Ready changes it: peer terms are judged against it.
	n.term.Store(hs.GetTerm())
	n.terms = NewTermGuard(n.cfg.Clock, hs.GetTerm())
	rn, err := raft.NewRawNode(c)
	if err != nil {
		return nil, fmt.Errorf("start raft: %w", err)
	}
	if last == 0 && raft.IsEmptyHardState(hs) && len(peers) > 0 {
		if err := rn.Bootstrap(peers); err != nil {
			return nil, fmt.Errorf("bootstrap raft: %w", err)
		}
	}
	return rn, nil
}

// Run runs the node until stop closes: the Ready loop on this goroutine, and beside it the ReadIndex
// rounds, the disk watchdog, the snapshot writer and the leader-loss hint. It returns once all of them
// have ended.
func (n *Node) Run(stop <-chan struct{}) {
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	wg.Go(func() { n.reads.run(stop) })
	wg.Go(func() {
		// On a stalled write the node stops serving with the watchdog's error, while the loop may
		// still be blocked in that write.
		n.watchdog.Watch(stop, n.done, n.cfg.DiskStallTimeout, func(err error) {
			n.Fail(err)
			n.Halt()
		})
	})
	wg.Go(func() { n.snapshots.Run(stop) })
	wg.Go(func() { n.leaderLoss.Run(ctx) })
	n.loop(stop)
	<-stop
	cancel()
	wg.Wait()
}

// loop is the Ready loop: it takes in what is queued for raft (ticks, peer messages, proposals, calls;
// raftHost), then handles every Ready that makes: send, apply, persist (handleReady). It returns when
// stop is closed or on a fatal error (a failed disk write: nothing unpersisted may be acted on).
func (n *Node) loop(stop <-chan struct{}) {
	defer n.Halt()
	if n.cfg.Handler.Stopped != nil {
		defer n.cfg.Handler.Stopped()
	}
	ticker := time.NewTicker(n.cfg.TickInterval)
	defer ticker.Stop()
	n.lastTick.ticked(n.cfg.Clock.Now())
	h := n.raftHost
	for {
		// Proposals wait in their queue while raft knows no leader: it would drop them.
		props := h.proposals
		if n.leader.Load() == raft.None {
			props = nil
		}
		select {
		case <-stop:
			// The HardState persist held back, written as the loop ends.
			if err := n.flushHardState(); err != nil {
				n.log.Warn("could not persist the last commit index", "err", err)
			}
			return
		case <-ticker.C:
			n.tick()
		case res := <-n.snapshots.Results():
			if err := n.snapshots.Taken(res); err != nil {
				n.Fail(err)
				return
			}
		case p := <-props:
			h.pending = append(h.pending, p)
		case m := <-h.messages:
			h.stepMessage(m)
		case fn := <-h.calls:
			fn(h.rn)
		case <-n.notices.Due():
			n.cfg.Send(n.notices.Release())
		}
		h.intake(props != nil)
		if err := n.handleReadys(); err != nil {
			n.Fail(err)
			return
		}
	}
}

// handleReadys handles Readys until raft has none: the responses a Ready's writes step back (a leader's
// own acknowledgement, say) make the next one.
func (n *Node) handleReadys() error {
	for n.rn.HasReady() {
		if err := n.handleReady(n.rn.Ready()); err != nil {
			return err
		}
	}
	return nil
}

// tick advances raft's logical clock and tells the layer above. A gap much longer than the tick means
// this loop could not run (a blocked disk, a paused process): the layer above hears how long (the lessor
// extends every deadline by it, so clients are not punished for the server's stall).
func (n *Node) tick() {
	now := n.cfg.Clock.Now()
	stalled := n.lastTick.since(now) - n.cfg.TickInterval
	if stalled <= stallThreshold(n.cfg.TickInterval) {
		stalled = 0
	}
	n.lastTick.ticked(now)
	n.ticks.Add(1)
	n.rn.Tick()
	if n.cfg.Handler.Tick != nil {
		n.cfg.Handler.Tick(now, stalled)
	}
}

// lastTick is when the loop last ticked, as an offset on the node's clock from base plus one (0: the
// loop has not started). An offset between two readings of the clock, so a step of the wall clock is
// no stall.
type lastTick struct {
	base time.Time
	at   atomic.Int64
}

// ticked records that the loop ticked at now.
func (t *lastTick) ticked(now time.Time) { t.at.Store(int64(now.Sub(t.base)) + 1) }

// since is the time from the loop's last tick to now (0 before the loop started).
func (t *lastTick) since(now time.Time) time.Duration {
	last := t.at.Load()
	if last == 0 {
		return 0
	}
	return now.Sub(t.base) - time.Duration(last-1)
}

func stallThreshold(tick time.Duration) time.Duration {
	return max(4*tick, 50*time.Millisecond)
}

// handleReady handles one Ready. Raft runs with asynchronous storage writes (newRawNode): the log write
// and the apply come as two messages in rd.Messages, to raft's LocalAppendThread and LocalApplyThread,
// each carrying the responses to deliver once it is done (LocalStorage). The messages to peers go out
// first, so the followers write new entries while this node writes them too; a leader's own
// acknowledgement of them is one of the append's responses, stepped back into raft only once its write
// is durable, so it counts itself toward a commit only then (decision 8). A follower's acknowledgement to
// the leader is another: it leaves only after the follower's write. The apply, then the append, run here
// on the loop; the loop takes the next Ready only after both.
func (n *Node) handleReady(rd raft.Ready) error {
	if rd.HardState != nil && !raft.IsEmptyHardState(rd.HardState) {
		n.term.Store(rd.HardState.GetTerm())
		n.terms.Observe(rd.HardState.GetTerm())
		n.commit.Store(rd.HardState.GetCommit())
	}
	if rd.SoftState != nil {
		n.updateSoftState(rd.SoftState)
	}
	appendMsg, applyMsg, peerMsgs := SplitLocal(rd.Messages)
	if appendMsg != nil {
		// Peers may acknowledge these entries before this node's write of them returns: the peer checks
		// count them as part of the log (LogEnd).
		n.local.Begin(appendMsg)
	}
	n.cfg.Send(n.notices.Filter(peerMsgs))
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

// persist makes a log append durable before anything acts on it (decision 8): one WAL write and
// fdatasync, then the acked mark (raftlog).
// An append that raft says needs no sync (mustSync false: no entries, and only the commit index moved)
// is not written at all: a stale commit index on disk is safe, since committed entries are learned again
// from the leader after a restart, and its responses attest nothing this write would add (the entries
// they acknowledge were made durable by earlier appends, which the loop finished in order). The newest
// such HardState is kept and written with the next Save, and always before a snapshot (raft refuses to
// restart with a commit index below its snapshot).
func (n *Node) persist(hs *raftpb.HardState, ents []*raftpb.Entry, snap *raftpb.Snapshot, mustSync bool) error {
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
	if err := n.watchdog.Write("save", func() error { return n.cfg.Writer.Save(hs, ents, snap) }); err != nil {
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
func (n *Node) updateLogEntries() {
	first, err1 := n.cfg.Storage.FirstIndex()
	last, err2 := n.cfg.Storage.LastIndex()
	if err1 == nil && err2 == nil && last+1 >= first {
		n.metrics.logEntries.Set(float64(last + 1 - first))
	}
}

// flushHardState writes a HardState that persist held back.
func (n *Node) flushHardState() error {
	if n.unsyncedHS == nil {
		return nil
	}
	start := time.Now()
	if err := n.watchdog.Write("save", func() error { return n.cfg.Writer.Save(n.unsyncedHS, nil, nil) }); err != nil {
		return fmt.Errorf("persist hard state: %w", err)
	}
	n.metrics.fsyncSeconds.Observe(since(start))
	n.unsyncedHS = nil
	return nil
}

func (n *Node) updateSoftState(ss *raft.SoftState) {
	wasLeader := n.IsLeader()
	// A change to a new, known leader (as etcd counts them): losing sight of the leader is not one.
	if ss.Lead != raft.None && ss.Lead != n.lastLeader {
		n.metrics.leaderChanges.Inc()
		n.lastLeader = ss.Lead
	}
	n.role.Store(int32(ss.RaftState))
	if n.leader.Swap(ss.Lead) != ss.Lead {
		// Last, once the role and the layer above are the new leader's: a woken waiter may act at once.
		defer n.leaderSwitch.changed()
	}
	isLeader := ss.RaftState == raft.StateLeader
	h := n.cfg.Handler
	switch {
	case isLeader && !wasLeader:
		n.log.Info("became leader", "term", n.term.Load())
		if h.BecameLeader != nil {
			h.BecameLeader(n.term.Load())
		}
	case !isLeader && wasLeader:
		n.log.Info("lost leadership", "leader", leasepb.FormatID(ss.Lead))
		if h.LostLeadership != nil {
			h.LostLeadership()
		}
		n.notices.Forget() // the followers learn the commit index from the next leader
		// Entries this node proposed may be lost or may commit under the next leader: tell their callers
		// now rather than at their timeout, so clients retry at once (a request id or a token makes a
		// retry safe).
		n.cfg.Proposers.FailAll(errLeadershipLost)
	}
}

// restore makes a snapshot received from the leader the node's state (Applier.Decode's Restore), then
// takes up its index and configuration.
func (n *Node) restore(snap *raftpb.Snapshot, restore Restore) error {
	if err := restore(snap); err != nil {
		return err
	}
	n.confState = snap.GetMetadata().GetConfState()
	n.snapshots.Restored(snap.GetMetadata().GetIndex())
	n.restores.Add(1)
	n.metrics.snapBytes.Set(float64(len(snap.GetData())))
	n.updateLogEntries()
	return nil
}

// ApplyConfChange applies a committed conf change to raft (on the loop: from Applier.Apply); reconfigures
// says it changed the voters or learners, after which the next snapshot comes at once.
func (n *Node) ApplyConfChange(cc raftpb.ConfChangeI, reconfigures bool) {
	n.confState = n.rn.ApplyConfChange(cc)
	if reconfigures {
		n.snapshots.ConfChanged()
	}
}

func since(start time.Time) float64 { return time.Since(start).Seconds() }
