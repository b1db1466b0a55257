package server

import (
	"context"
	"fmt"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/leased/leased/server/internal/raftnode"
)

// The Ready loop drives raft's RawNode itself (raftHost below) rather than through raft.Node, which runs
// raft in a goroutine of its own: there every proposal, every peer message, every Ready and every
// storage response stepped back crossed between two goroutines, a wake-up each. Here the loop steps
// what arrives, takes the Ready, writes, applies and steps the responses back in one goroutine, and the
// proposals that queued while it wrote enter raft as one batch. Goroutines other than the loop reach raft
// through raftControl, whose calls queue work for the loop.

// raftControl is what goroutines other than the Ready loop ask of raft. raftHost implements it; tests
// replace it. Each call queues work for the Ready loop and returns once it is queued, except Status and
// ProposeConfChange, which wait for the loop's answer; a call made after the loop ended returns
// raft.ErrStopped (Status: a zero Status).
type raftControl interface {
	// propose queues a proposal; a refusal reaches its proposer through the proposal waiter (id != 0).
	propose(ctx context.Context, p proposal) error
	Step(ctx context.Context, m *raftpb.Message) error
	ReadIndex(ctx context.Context, rctx []byte) error
	Campaign(ctx context.Context) error
	ForgetLeader(ctx context.Context) error
	TransferLeadership(ctx context.Context, lead, transferee uint64)
	ProposeConfChange(ctx context.Context, cc raftpb.ConfChangeI) error
	Status() raft.Status
	ReportUnreachable(id uint64)
	ReportSnapshot(id uint64, status raft.SnapshotStatus)
}

// proposal is one command for the log. id names the proposer waiting for it in the proposal waiter (0:
// nobody waits). term, if not 0, is the term the command was decided in: it enters the log only while
// this node still leads in that term (the lessor's commands, proposeAsync).
type proposal struct {
	data []byte
	id   uint64
	term uint64
}

// Queue sizes: enough for every caller of a busy node to queue while the loop writes, so that they
// rarely block, and the most the loop takes in before it handles a Ready.
const (
	proposalQueue = 1024
	messageQueue  = 1024
	callQueue     = 64
	maxIntake     = 4096
)

// raftHost owns the RawNode on behalf of the Ready loop. Only the loop touches rn; the channels carry
// work to it from other goroutines.
type raftHost struct {
	rn        *raft.RawNode
	id        uint64
	pending   []proposal // taken from the queue, to be stepped as one batch (loop only)
	proposals chan proposal
	messages  chan *raftpb.Message
	calls     chan func(*raft.RawNode)
	// stopped closes when the loop no longer serves (node.done).
	stopped <-chan struct{}
	// refused tells a proposer that raft dropped its proposal (called on the loop).
	refused func(id uint64, err error)
	// dropped counts a peer message refused on the loop (leased_peer_messages_dropped_total); may be nil.
	dropped func(reason string, count int)
	// send hands messages to the peer transport (deliver).
	send func(msgs []*raftpb.Message)
}

func newRaftHost(rn *raft.RawNode, id uint64, stopped <-chan struct{}, refused func(uint64, error)) *raftHost {
	return &raftHost{
		rn:        rn,
		id:        id,
		proposals: make(chan proposal, proposalQueue),
		messages:  make(chan *raftpb.Message, messageQueue),
		calls:     make(chan func(*raft.RawNode), callQueue),
		stopped:   stopped,
		refused:   refused,
	}
}

func (h *raftHost) propose(ctx context.Context, p proposal) error {
	return enqueue(ctx, h.stopped, h.proposals, p)
}

func (h *raftHost) Step(ctx context.Context, m *raftpb.Message) error {
	return enqueue(ctx, h.stopped, h.messages, m)
}

// post queues fn to run on the loop.
func (h *raftHost) post(ctx context.Context, fn func(*raft.RawNode)) error {
	return enqueue(ctx, h.stopped, h.calls, fn)
}

// enqueue puts v on the loop's queue q, unless ctx ends or the loop stops serving first.
func enqueue[T any](ctx context.Context, stopped <-chan struct{}, q chan<- T, v T) error {
	select {
	case q <- v:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-stopped:
		return raft.ErrStopped
	}
}

// call runs fn on the loop and returns its error.
func (h *raftHost) call(ctx context.Context, fn func(*raft.RawNode) error) error {
	res := make(chan error, 1)
	if err := h.post(ctx, func(rn *raft.RawNode) { res <- fn(rn) }); err != nil {
		return err
	}
	select {
	case err := <-res:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-h.stopped:
		return raft.ErrStopped
	}
}

func (h *raftHost) ReadIndex(ctx context.Context, rctx []byte) error {
	return h.post(ctx, func(rn *raft.RawNode) { rn.ReadIndex(rctx) })
}

func (h *raftHost) Campaign(ctx context.Context) error {
	return h.post(ctx, func(rn *raft.RawNode) { _ = rn.Campaign() })
}

func (h *raftHost) ForgetLeader(ctx context.Context) error {
	return h.post(ctx, func(rn *raft.RawNode) { _ = rn.ForgetLeader() })
}

func (h *raftHost) TransferLeadership(ctx context.Context, _, transferee uint64) {
	_ = h.post(ctx, func(rn *raft.RawNode) { rn.TransferLeader(transferee) })
}

func (h *raftHost) ProposeConfChange(ctx context.Context, cc raftpb.ConfChangeI) error {
	return h.call(ctx, func(rn *raft.RawNode) error { return rn.ProposeConfChange(cc) })
}

func (h *raftHost) Status() raft.Status {
	res := make(chan raft.Status, 1)
	if h.post(context.Background(), func(rn *raft.RawNode) { res <- rn.Status() }) != nil {
		return raft.Status{}
	}
	select {
	case st := <-res:
		return st
	case <-h.stopped:
		return raft.Status{}
	}
}

func (h *raftHost) ReportUnreachable(id uint64) {
	_ = h.post(context.Background(), func(rn *raft.RawNode) { rn.ReportUnreachable(id) })
}

func (h *raftHost) ReportSnapshot(id uint64, status raft.SnapshotStatus) {
	_ = h.post(context.Background(), func(rn *raft.RawNode) { rn.ReportSnapshot(id, status) })
}

// intake is the Ready loop's side: it serves what is queued without blocking, at most maxIntake items,
// then steps the proposals it took (with any already pending) as one batch. acceptProposals is false
// while raft knows no leader: proposals then wait in their queue (raft would drop them), as raft.Node
// made them wait.
func (h *raftHost) intake(acceptProposals bool) {
	props := h.proposals
	if !acceptProposals {
		props = nil
	}
	for range maxIntake {
		select {
		case p := <-props:
			h.pending = append(h.pending, p)
			continue
		case m := <-h.messages:
			h.stepMessage(m)
			continue
		case fn := <-h.calls:
			fn(h.rn)
			continue
		default:
		}
		break
	}
	h.proposeBatch(h.pending)
	clear(h.pending) // the queue's data is garbage once stepped
	h.pending = h.pending[:0]
}

// stepMessage steps a peer's message. Raft's refusals (a response from a peer it no longer tracks, a
// local message type from the network) drop the message, as raft.Node dropped them. The peer checks
// that need raft's own view are made here, as it would step the message (fitsRaftState): a leader's
// message from a member that is not the leader, say.
func (h *raftHost) stepMessage(m *raftpb.Message) {
	if needsRaftState(m.GetType()) && !fitsRaftState(h.rn.BasicStatus(), m) {
		if h.dropped != nil {
			h.dropped(dropMalformed, 1)
		}
		return
	}
	_ = h.rn.Step(m)
}

// proposeBatch steps proposals as one MsgProp: raft appends all of them or drops all (no leader here,
// a leadership transfer under way, the uncommitted-size limit). A lessor command decided in another term
// than the one this node now leads in is dropped first (proposeAsync says why).
func (h *raftHost) proposeBatch(batch []proposal) {
	if len(batch) == 0 {
		return
	}
	var st *raft.BasicStatus
	ents := make([]*raftpb.Entry, 0, len(batch))
	kept := batch[:0]
	for _, p := range batch {
		if p.term != 0 {
			if st == nil {
				s := h.rn.BasicStatus()
				st = &s
			}
			if st.RaftState != raft.StateLeader || st.GetTerm() != p.term {
				if p.id != 0 { // a lessor entry whose proposer paces the rest on it
					h.refused(p.id, ErrNotLeader)
				}
				continue
			}
		}
		ents = append(ents, &raftpb.Entry{Data: p.data})
		kept = append(kept, p)
	}
	if len(ents) == 0 {
		return
	}
	err := h.rn.Step(&raftpb.Message{Type: raftpb.MessageType_MsgProp.Enum(), From: new(h.id), Entries: ents})
	if err == nil {
		return
	}
	for _, p := range kept {
		if p.id != 0 {
			h.refused(p.id, err)
		}
	}
}

// deliver hands a finished storage write's responses on (raftnode.LocalStorage): those to peers to the
// transport first (a follower's acknowledgement is what the leader waits for), then those to this node
// back into raft, in order, at once (not through the peer checks, which refuse a message from this node
// itself). Raft refuses only a response from a peer it stopped tracking (this node, removed): dropped,
// as raft.Node dropped it.
func (h *raftHost) deliver(resps []*raftpb.Message) {
	var peers []*raftpb.Message
	for _, r := range resps {
		if r.GetTo() != h.id {
			peers = append(peers, r)
		}
	}
	if len(peers) > 0 {
		h.send(peers)
	}
	for _, r := range resps {
		if r.GetTo() != h.id {
			continue
		}
		_ = h.rn.Step(r)
	}
}

// startRaft makes the node's RawNode, bootstrapped with peers on an empty log.
func startRaft(n *node, storage raft.Storage, applied uint64, peers []raft.Peer) (*raft.RawNode, error) {
	c := &raft.Config{
		ID:                        n.id,
		ElectionTick:              n.cfg.ElectionTicks,
		HeartbeatTick:             n.cfg.HeartbeatTicks,
		Storage:                   storage,
		Applied:                   applied,
		MaxSizePerMsg:             1 << 20,
		MaxCommittedSizePerReady:  16 << 20,
		MaxUncommittedEntriesSize: 64 << 20,
		MaxInflightMsgs:           256,
		CheckQuorum:               true,
		PreVote:                   true,
		ReadOnlyOption:            raft.ReadOnlySafe,
		// The log write and the apply come as messages in the Ready (raftnode.LocalStorage): a leader sends
		// new entries to its followers while it writes them itself, and counts its own acknowledgement
		// only once its write is durable (decision 8).
		AsyncStorageWrites: true,
		// A follower drops proposals instead of handing them to the leader: client writes are forwarded
		// by serveWrite (one path), and the lessor's Expire and Checkpoint entries carry the proposing
		// leader's view (a remaining TTL) that must not reach the log from a node that stopped leading.
		DisableProposalForwarding: true,
		Logger:                    raftnode.NewRaftLogger(n.log),
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
	n.terms = raftnode.NewTermGuard(n.clock, hs.GetTerm())
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
