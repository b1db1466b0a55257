package raftnode

import (
	"context"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/leased/leased/server/internal/errs"
)

// The Ready loop drives raft's RawNode itself (raftHost below) rather than through raft.Node, which runs
// raft in a goroutine of its own: there every proposal, every peer message, every Ready and every
// storage response stepped back crossed between two goroutines, a wake-up each. Here the loop steps
// what arrives, takes the Ready, writes, applies and steps the responses back in one goroutine, and the
// proposals that queued while it wrote enter raft as one batch. Goroutines other than the loop reach raft
// through the host's calls (promoted to Node), which queue work for the loop and return once it is
// queued, except Status and ProposeConfChange, which wait for the loop's answer; a call made after the
// loop ended returns raft.ErrStopped (Status: a zero Status).

// Proposal is one command for the log. ID names the proposer waiting for it in the proposal waiter (0:
// nobody waits). Term, if not 0, is the term the command was decided in: it enters the log only while
// this node still leads in that term (the lessor's commands).
type Proposal struct {
	Data []byte
	ID   uint64
	Term uint64
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
	pending   []Proposal // taken from the queue, to be stepped as one batch (loop only)
	proposals chan Proposal
	messages  chan *raftpb.Message
	calls     chan func(*raft.RawNode)
	// stopped closes when the loop no longer serves (Node.Done).
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
		proposals: make(chan Proposal, proposalQueue),
		messages:  make(chan *raftpb.Message, messageQueue),
		calls:     make(chan func(*raft.RawNode), callQueue),
		stopped:   stopped,
		refused:   refused,
	}
}

// Propose queues a proposal; a refusal reaches its proposer through Config.Proposers (ID != 0).
func (h *raftHost) Propose(ctx context.Context, p Proposal) error {
	return enqueue(ctx, h.stopped, h.proposals, p)
}

// Step queues a peer's message for raft; the checks that need raft's own view are made as the loop
// steps it (stepMessage).
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

func (h *raftHost) readIndex(ctx context.Context, rctx []byte) error {
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
// than the one this node now leads in is dropped first: it may have waited in the queue across a
// leadership change, during which another leader renewed the leases it names.
func (h *raftHost) proposeBatch(batch []Proposal) {
	if len(batch) == 0 {
		return
	}
	var st *raft.BasicStatus
	ents := make([]*raftpb.Entry, 0, len(batch))
	kept := batch[:0]
	for _, p := range batch {
		if p.Term != 0 {
			if st == nil {
				s := h.rn.BasicStatus()
				st = &s
			}
			if st.RaftState != raft.StateLeader || st.GetTerm() != p.Term {
				if p.ID != 0 { // a lessor entry whose proposer paces the rest on it
					h.refused(p.ID, errs.ErrNotLeader)
				}
				continue
			}
		}
		ents = append(ents, &raftpb.Entry{Data: p.Data})
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
		if p.ID != 0 {
			h.refused(p.ID, err)
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
