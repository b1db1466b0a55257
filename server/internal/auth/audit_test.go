package auth

import (
	"bytes"
	"log/slog"
	"regexp"
	"strings"
	"testing"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/fsm"
)

// TestAuditNewLeaderCatchesUp: a node writes nothing at info for the entries it applies as a follower,
// and when it starts leading (its first applied entry as leader, the empty one of its term) it writes
// their lines at info, marked replayed, before its own: the old leader may have stopped before writing
// them.
func TestAuditNewLeaderCatchesUp(t *testing.T) {
	var buf bytes.Buffer
	a := NewAuditTrail(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})), 0)
	go a.Run()
	granted := func(i uint64) fsm.Result {
		return fsm.Result{Events: []fsm.Event{{Type: leasepb.EventType_EVENT_TYPE_GRANTED, Index: i,
			Lease: fsm.Lease{Resource: "r", Holder: "h", Token: i}}}}
	}
	a.Record(5, "follower", granted(5))
	a.Record(6, "follower", granted(6))
	a.HandOff()
	a.WaitWritten()
	if buf.Len() != 0 {
		t.Fatalf("a follower wrote at info:\n%s", buf.String())
	}
	a.Record(7, RoleLeader, fsm.Result{}) // the new leader's empty entry
	a.Record(8, RoleLeader, granted(8))
	a.Close()
	<-a.done
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := []string{"token=5 .* role=leader replayed=true", "token=6 .* role=leader replayed=true", "token=8 .* role=leader$"}
	if len(lines) != len(want) {
		t.Fatalf("lines:\n%s\nwant %d", buf.String(), len(want))
	}
	for i, w := range want {
		if !regexp.MustCompile(w).MatchString(lines[i]) {
			t.Errorf("line %d = %q, want %q", i, lines[i], w)
		}
	}
	// Leading on, nothing is replayed again.
	if len(a.behind) != 0 {
		t.Errorf("%d lines still kept after catching up", len(a.behind))
	}
}
