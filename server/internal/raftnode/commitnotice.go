package raftnode

import (
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

// CommitNoticeDelay is how long a commit notice may wait for an append to carry it instead. Longer than
// the gap between two appends while clients write (a client's round trip and an apply: well under a
// millisecond on a LAN), so that one nearly always does; short against everything a follower's commit
// index serves (its serializable reads, its applied index in status; a follower's linearizable read
// learns the commit from the leader's heartbeat round itself), and against the heartbeat interval, which
// would otherwise be when an idle follower learns of the last write.
const CommitNoticeDelay = 2 * time.Millisecond

// CommitNotices holds back the appends raft sends a follower only to tell it that the commit index
// moved (a MsgApp without entries), for up to CommitNoticeDelay. Raft sends one to every follower each
// time the commit index advances, right after the acknowledgement that advanced it; the next append of
// entries carries the commit index anyway (every MsgApp does), and under steady load it follows within a
// client's round trip. Sent at once, the notices double the leader's peer messages at light load and go
// out before the Ready's apply, ahead of the answers its clients wait for; each also makes every
// follower run a Ready and answer it.
//
// Holding one is safe: raft allows any message to be delayed or lost (a follower learns the commit
// index from the next append or heartbeat), and commitment itself never depends on what a follower
// knows of it. A held notice is dropped when a later append to the same follower goes out (its commit
// index is at least the notice's) and sent when the delay runs out. Ready loop only.
type CommitNotices struct {
	held  map[uint64]*raftpb.Message // by follower; the newest notice
	timer *time.Timer                // runs while held is not empty
	armed bool                       // the timer runs: filter, on every Ready, stops it only then
}

// NewCommitNotices returns CommitNotices holding none.
func NewCommitNotices() *CommitNotices {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &CommitNotices{held: map[uint64]*raftpb.Message{}, timer: t}
}

// Filter returns msgs without the commit notices, which it holds; an append with entries to a
// follower supersedes the notice held for it. It reuses msgs' array.
func (c *CommitNotices) Filter(msgs []*raftpb.Message) []*raftpb.Message {
	out := msgs[:0]
	for _, m := range msgs {
		if m.GetType() != raftpb.MsgApp {
			out = append(out, m)
			continue
		}
		if len(m.GetEntries()) > 0 {
			delete(c.held, m.GetTo())
			out = append(out, m)
			continue
		}
		if !c.armed {
			c.timer.Reset(CommitNoticeDelay)
			c.armed = true
		}
		c.held[m.GetTo()] = m
	}
	if len(c.held) == 0 {
		c.disarm()
	}
	return out
}

// disarm stops the timer if it runs.
func (c *CommitNotices) disarm() {
	if c.armed {
		c.timer.Stop()
		c.armed = false
	}
}

// Due fires when held notices have waited CommitNoticeDelay.
func (c *CommitNotices) Due() <-chan time.Time { return c.timer.C }

// Release returns the held notices and forgets them.
func (c *CommitNotices) Release() []*raftpb.Message {
	out := make([]*raftpb.Message, 0, len(c.held))
	for _, m := range c.held {
		out = append(out, m)
	}
	c.Forget()
	return out
}

// Forget drops the held notices (leadership was lost: they speak for a term that ended).
func (c *CommitNotices) Forget() {
	clear(c.held)
	c.disarm()
}
