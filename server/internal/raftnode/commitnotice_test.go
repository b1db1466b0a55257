package raftnode

import (
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

func appendTo(to, commit uint64, entries int) *raftpb.Message {
	m := &raftpb.Message{Type: raftpb.MsgApp.Enum(), To: &to, Commit: &commit}
	for range entries {
		m.Entries = append(m.Entries, &raftpb.Entry{})
	}
	return m
}

// A commit notice is held; an append of entries to the same follower goes out and supersedes it;
// everything else passes untouched, in order.
func TestCommitNoticesAreHeldUntilAnAppendCarriesThem(t *testing.T) {
	c := NewCommitNotices()
	hb := &raftpb.Message{Type: raftpb.MsgHeartbeat.Enum(), To: new(uint64(2))}
	apps := appendTo(3, 7, 1)
	out := c.Filter([]*raftpb.Message{appendTo(2, 7, 0), hb, appendTo(3, 7, 0), apps})
	if len(out) != 2 || out[0] != hb || out[1] != apps {
		t.Fatalf("sent %v, want the heartbeat and the append of entries", out)
	}
	if len(c.held) != 1 || c.held[2] == nil {
		t.Fatalf("held %v, want follower 2's notice only (3's went with its append)", c.held)
	}
	app2 := appendTo(2, 8, 2)
	if out := c.Filter([]*raftpb.Message{app2}); len(out) != 1 || out[0] != app2 {
		t.Fatalf("sent %v, want the append", out)
	}
	if len(c.held) != 0 {
		t.Fatalf("held %v after an append to every follower", c.held)
	}
	select {
	case <-c.Due():
		t.Fatal("due with nothing held")
	default:
	}
}

// Notices nothing supersedes go out once they have waited CommitNoticeDelay, the newest per follower.
func TestCommitNoticesGoOutWhenDue(t *testing.T) {
	c := NewCommitNotices()
	newest := appendTo(2, 9, 0)
	start := time.Now()
	c.Filter([]*raftpb.Message{appendTo(2, 8, 0)})
	c.Filter([]*raftpb.Message{newest, appendTo(3, 9, 0)})
	select {
	case <-c.Due():
	case <-time.After(10 * time.Second):
		t.Fatal("held notices never came due")
	}
	if waited := time.Since(start); waited < CommitNoticeDelay {
		t.Fatalf("due after %v, before CommitNoticeDelay (%v)", waited, CommitNoticeDelay)
	}
	out := c.Release()
	if len(out) != 2 || len(c.held) != 0 {
		t.Fatalf("released %v (held now %v), want one notice per follower and none left", out, c.held)
	}
	for _, m := range out {
		if m.GetTo() == 2 && m != newest {
			t.Fatalf("released %v for follower 2, want its newest notice", m)
		}
	}
}
