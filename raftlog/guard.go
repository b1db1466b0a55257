package raftlog

import (
	"encoding/binary"
	"fmt"

	"go.etcd.io/raft/v3/raftpb"
)

// ackMark is the ack file's record of how far this node's log had got, for
// the amnesia guard: a log position (index and term) the WAL held durably,
// and the HardState's term and vote at that time. raft counts this node's
// acknowledgements and votes toward quorums; a node that comes back with
// less than it had (a WAL that lost records a disk acknowledged, a last
// record damaged so that it reads as torn, a stale copy of wal/) could vote
// for a candidate missing entries it helped commit, or vote twice in a
// term. Open refuses such a log (ErrShortLog).
//
// Every Save that appends entries, installs a snapshot or changes the term
// or the vote records the mark (ackfile.go) after its WAL write has
// returned and before Save returns: so it never claims more than the WAL
// holds (a crash cannot leave it ahead of a torn write nobody
// acknowledged), and raft, which acknowledges or votes only after Save,
// never acknowledges what the mark does not cover. It costs a second
// fdatasync on those Saves.
type ackMark struct {
	at         point  // an entry the log held (or compacted past)
	term, vote uint64 // the HardState's term and vote
}

// raw is m's encoding: index, term, hard state term, vote, big-endian.
func (m ackMark) raw() []byte {
	b := appendPoint(nil, m.at)
	b = binary.BigEndian.AppendUint64(b, m.term)
	return binary.BigEndian.AppendUint64(b, m.vote)
}

// decodeRawAckMark decodes raw's encoding.
func decodeRawAckMark(b []byte) (ackMark, error) {
	if len(b) != 32 {
		return ackMark{}, fmt.Errorf("acked of %d bytes, want 32", len(b))
	}
	p, rest, _ := decodePoint(b)
	return ackMark{at: p, term: binary.BigEndian.Uint64(rest), vote: binary.BigEndian.Uint64(rest[8:])}, nil
}

// decodeLegacyAckMark decodes the sealed mark a format 2 raft.db kept under
// "acked"; a file without one has the zero mark, which every log satisfies.
func decodeLegacyAckMark(v []byte) (ackMark, error) {
	if v == nil {
		return ackMark{}, nil
	}
	b, err := unseal(v)
	if err != nil {
		return ackMark{}, fmt.Errorf("acked: %w", err)
	}
	return decodeRawAckMark(b)
}

// markOf is the mark for a state whose every record is durable.
func markOf(st *state) ackMark {
	return ackMark{at: st.point(st.last), term: st.hs.GetTerm(), vote: st.hs.GetVote()}
}

// termOrVoteChanged reports whether a Save moves the HardState to another
// term or vote: the moments raft's safety rests on what this node's log
// held (it votes, or it starts counting acknowledgements for a new leader).
func termOrVoteChanged(old, next *raftpb.HardState) bool {
	return old.GetTerm() != next.GetTerm() || old.GetVote() != next.GetVote()
}

// markTracker follows WAL replay and notes whether the log ever held the
// mark's position: the batch that wrote it precedes the mark, so an intact
// WAL always replays through it, even if later records overwrote it.
type markTracker struct {
	mark    ackMark
	reached bool
}

// observe checks st after a batch (or the start of replay).
func (t *markTracker) observe(st *state) {
	if t.reached {
		return
	}
	i := t.mark.at.index
	switch {
	case st.terms.runs == nil:
	case i <= st.offset():
		t.reached = true // compacted past it (or a snapshot at or above it)
	case i <= st.last && st.terms.term(i) == t.mark.at.term:
		t.reached = true
	}
}

// check returns ErrShortLog, naming the mark's file and the last segment,
// if the replayed log lacks the mark's position or has an older term or
// another vote than it.
func (t *markTracker) check(st *state, markPath, lastSeg string) error {
	m := t.mark
	hs := st.hs
	var why string
	switch {
	case !t.reached:
		why = fmt.Sprintf("it records that the log held entry %d (term %d), but the WAL ends at %d (term %d) and never held it",
			m.at.index, m.at.term, st.last, st.terms.term(st.last))
	case hs.GetTerm() < m.term:
		why = fmt.Sprintf("it records term %d, but the WAL's hard state is at term %d", m.term, hs.GetTerm())
	case hs.GetTerm() == m.term && m.vote != 0 && hs.GetVote() != m.vote:
		why = fmt.Sprintf("it records a vote for %x in term %d, but the WAL's hard state has %x", m.vote, m.term, hs.GetVote())
	default:
		return nil
	}
	return fmt.Errorf("raftlog: %s: %w (%w): %s: the WAL, whose last segment is %s, lost records this node acknowledged",
		markPath, ErrCorrupt, ErrShortLog, why, lastSeg)
}
