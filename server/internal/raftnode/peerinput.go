package raftnode

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/raft/v3/confchange"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"

	"github.com/leased/leased/server/transport"
)

// Hostile peer input. raft trusts its peers: a message from a buggy or forged member can make it panic
// (a heartbeat committing past the end of the log, entries that overlap committed ones) or wrap a term
// counter that it then persists (a term of 2^64−1, plus one at the next campaign, is 0). With peer TLS
// the transport already refuses strangers and drops batches a member sends in another's name; what is
// left is checked here, on every message, before raft sees it. Each check is cheap (no disk read: the
// log's last index is kept in memory) and refuses only what a correct member never sends.

// Reasons a peer message is dropped: the label values of leased_peer_messages_dropped_total.
const (
	dropSenderMismatch = transport.RejectSenderMismatch // the batch's sender is not its certificate's member (transport)
	dropNotMember      = "not_member"                   // from an id that is not a member, or from ourselves
	dropType           = "type"                         // a message type that never travels between nodes
	dropTerm           = "term"                         // a term far ahead of this node's, or a term or index too large to be real
	dropCommit         = "commit"                       // a heartbeat committing past the end of this node's log
	dropMalformed      = "malformed"                    // entries, acknowledgements or a snapshot that cannot be right
)

// PeerDropReasons are every reason a peer message is dropped, for the metric's label values.
var PeerDropReasons = []string{dropSenderMismatch, dropNotMember, dropType, dropTerm, dropCommit, dropMalformed}

// maxPeerTerm bounds terms and indexes a peer may send: TermCeiling leaves raft every increment it will
// ever make without overflow. A term must also be within the node's allowance (TermGuard): not far ahead
// of its own.
const maxPeerTerm = TermCeiling

// peerTypes are the raft messages that travel between nodes. The others are local (MsgHup, MsgBeat, the
// storage messages, ...) or unused here (MsgProp: proposal forwarding is disabled).
var peerTypes = map[raftpb.MessageType]bool{
	raftpb.MsgApp: true, raftpb.MsgAppResp: true, raftpb.MsgVote: true, raftpb.MsgVoteResp: true,
	raftpb.MsgPreVote: true, raftpb.MsgPreVoteResp: true, raftpb.MsgSnap: true, raftpb.MsgHeartbeat: true,
	raftpb.MsgHeartbeatResp: true, raftpb.MsgTransferLeader: true, raftpb.MsgTimeoutNow: true,
	raftpb.MsgReadIndex: true, raftpb.MsgReadIndexResp: true,
}

// PeerView is what the checks need of the local node.
type PeerView struct {
	Self     uint64
	IsMember func(id uint64) bool
	// LastIndex is the last index in the log: the durable log, or the append in flight (whose entries a
	// leader sends its followers while it writes them, so their acknowledgements may arrive first).
	LastIndex func() uint64
	// AcceptTerm reports whether a message at this term may reach raft (TermGuard.AcceptTerm).
	AcceptTerm func(term uint64) bool
	// CheckSnapshot checks a MsgSnap's data against the metadata raft acts on (Config.CheckSnapshot).
	CheckSnapshot func(s *raftpb.Snapshot, self, from uint64) error
}

// CheckPeerMessage returns why m must be dropped, or "" to let raft have it.
func CheckPeerMessage(m *raftpb.Message, v PeerView) string {
	switch {
	case m.GetFrom() == v.Self || !v.IsMember(m.GetFrom()):
		return dropNotMember
	case m.GetTo() != v.Self:
		return dropMalformed // the transport checks this too; raft would act on it regardless
	case !peerTypes[m.GetType()]:
		return dropType
	case m.GetTerm() >= maxPeerTerm || m.GetLogTerm() >= maxPeerTerm || m.GetIndex() >= maxPeerTerm ||
		m.GetCommit() >= maxPeerTerm || m.GetRejectHint() >= maxPeerTerm || !v.AcceptTerm(m.GetTerm()):
		return dropTerm
	case (m.GetTerm() == 0) != (m.GetType() == raftpb.MsgReadIndex):
		// raft takes a term of 0 for a local message and skips every term check; only a follower's
		// forwarded MsgReadIndex travels without one, and always without (a follower forwarding one with
		// a term to its leader panics).
		return dropMalformed
	case (m.GetType() == raftpb.MsgHeartbeat || m.GetType() == raftpb.MsgHeartbeatResp) && len(m.GetContext()) != 0 && len(m.GetContext()) != 8:
		// A heartbeat's context is a leader's read-index round (8 bytes), echoed back; the leader reads
		// 8 bytes from any non-empty one.
		return dropMalformed
	}
	switch m.GetType() {
	case raftpb.MsgHeartbeat:
		// raft commits the heartbeat's index outright and panics past the end of its log. A leader only
		// sends what the follower acknowledged (min(match, committed)), and the follower acknowledges only
		// what it persisted.
		if m.GetCommit() > v.LastIndex() {
			return dropCommit
		}
	case raftpb.MsgApp:
		if !consistentEntries(m) {
			return dropMalformed
		}
	case raftpb.MsgAppResp:
		// A follower acknowledges only entries this node sent it. A larger index would become its match
		// and the next index to send from, beyond the log.
		if !m.GetReject() && m.GetIndex() > v.LastIndex() {
			return dropMalformed
		}
	case raftpb.MsgSnap:
		if !validSnapshot(m, v) {
			return dropMalformed
		}
	}
	if len(m.GetEntries()) > 0 && m.GetType() != raftpb.MsgApp && m.GetType() != raftpb.MsgReadIndex &&
		m.GetType() != raftpb.MsgReadIndexResp {
		return dropMalformed
	}
	return ""
}

// consistentEntries reports whether a MsgApp's entries follow its previous entry (Index, LogTerm) one
// index at a time, with terms that never decrease and never exceed the leader's (raft's logSlice.valid,
// which raft itself checks only after acting on them).
func consistentEntries(m *raftpb.Message) bool {
	index, term := m.GetIndex(), m.GetLogTerm()
	if term > m.GetTerm() {
		return false
	}
	for _, e := range m.GetEntries() {
		if e.GetIndex() != index+1 || e.GetTerm() < term || e.GetTerm() > m.GetTerm() {
			return false
		}
		index, term = e.GetIndex(), e.GetTerm()
	}
	return index < maxPeerTerm
}

// validSnapshot reports whether a MsgSnap carries a snapshot raft can restore: an index and term, a term
// no newer than the sender's, a configuration raft accepts (it panics on one it cannot restore), and data
// this node can restore that agrees with them (PeerView.CheckSnapshot). Raft persists a snapshot it
// accepts before the node reads its data: data that does not decode would stop the node on every restart.
func validSnapshot(m *raftpb.Message, v PeerView) bool {
	md := m.GetSnapshot().GetMetadata()
	if md == nil || md.GetIndex() == 0 || md.GetIndex() >= maxPeerTerm || md.GetTerm() == 0 || md.GetTerm() > m.GetTerm() {
		return false
	}
	cs := md.GetConfState()
	if cs == nil || len(cs.GetVoters()) == 0 {
		return false
	}
	// What raft does on restore, including its check that the result is the configuration asked for
	// (it panics otherwise: a node that is both voter and learner, say).
	cfg, prs, err := confchange.Restore(confchange.Changer{Tracker: tracker.MakeProgressTracker(1, 0), LastIndex: md.GetIndex()}, cs)
	if err != nil {
		return false
	}
	pt := tracker.MakeProgressTracker(1, 0)
	pt.Config, pt.Progress = cfg, prs
	if cs.Equivalent(pt.ConfState()) != nil {
		return false
	}
	return v.CheckSnapshot(m.GetSnapshot(), v.Self, m.GetFrom()) == nil
}

// errPeerMessageDropped: a peer message failed CheckPeerMessage.
var errPeerMessageDropped = errors.New("peer message dropped")

// StepPeer checks a message from a peer (CheckPeerMessage) and queues it for raft, or drops it and
// counts it (Config.Dropped).
func (n *Node) StepPeer(ctx context.Context, m *raftpb.Message) error {
	if reason := CheckPeerMessage(m, n.peers); reason != "" {
		if n.cfg.Dropped != nil {
			n.cfg.Dropped(reason, 1)
		}
		return fmt.Errorf("%w (%s): %v from %x, term %d", errPeerMessageDropped, reason, m.GetType(), m.GetFrom(), m.GetTerm())
	}
	return n.Step(ctx, m)
}
