package auth

import (
	"context"
	"log/slog"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server/internal/leases"
)

// AuditTrail is a node's audit trail (docs/operations.md, "Audit trail"): a line per grant, release, expiry
// and ACL change, with the constant keys event, resource, token, holder, identity, index and role, to the
// node's audit log (server.Config.AuditLog).
// The leader writes it: a node applying an entry while it leads writes the entry's lines at info, any
// other node at debug (so one info line per event for the cluster). The role of the node that applies an
// entry is not a property of the entry, though: across a leadership change the old leader may stop (or
// crash) with lines it never wrote, for entries the new leader applied while it was still a follower. So
// every node keeps the lines of the last auditCatchUp events it applied without leading, and a node that
// starts leading writes them first, at info with replayed=true. The trail is thereby complete, with
// duplicates (same index) after a leader change; a reader deduplicates on index, resource and token.
//
// The node's Ready loop calls Record for each applied entry, HandOff after each apply, WaitWritten before a
// snapshot and Close as it ends; Run, the writer, is a goroutine of its own.
type AuditTrail struct {
	log   *slog.Logger
	on    bool // info is enabled: decided once, the level does not change while a node runs
	debug bool // debug is enabled: lines of entries applied without leading are written too

	pending []auditLine         // the lines of the Ready being applied (Ready loop only)
	behind  []auditLine         // the newest lines applied while not leading, at most auditCatchUp (Ready loop only)
	leading bool                // the previous entry was applied while leading (Ready loop only)
	upTo    uint64              // the newest index with a line in pending (Ready loop only)
	handed  uint64              // the newest index whose lines were handed over (Ready loop only)
	batches chan auditBatch     // to Run; closed by the loop as it ends
	written *leases.IndexWaiter // the newest index whose lines are written
	done    chan struct{}       // closed when Run returns
}

// auditLine is one entry's audit: an ACL change, or one lease event.
type auditLine struct {
	role     string
	replayed bool // written by a new leader for an entry it applied before it led
	aclSet   bool
	index    uint64 // of the ACL change
	event    fsm.Event
}

type auditBatch struct {
	lines []auditLine
	upTo  uint64
}

// RoleLeader is the role Record is given for an entry applied while leading: its lines are written at info.
const RoleLeader = "leader"

// auditCatchUp is how many lines of entries applied without leading a node keeps, to write when it starts
// leading: the old leader may not have written these. It bounds the completeness promise: an old leader
// whose writes lag more than this many lines when it stops leading may leave a gap.
const auditCatchUp = 4096

// auditBacklog is how many batches (Readys) the writer may be behind before the loop waits for it.
const auditBacklog = 64

// NewAuditTrail returns the trail of a node whose state holds the entries up to index from, writing to log.
func NewAuditTrail(log *slog.Logger, from uint64) *AuditTrail {
	return &AuditTrail{
		log: log, on: log.Enabled(context.Background(), slog.LevelInfo), debug: log.Enabled(context.Background(), slog.LevelDebug),
		batches: make(chan auditBatch, auditBacklog), written: leases.NewIndexWaiter(from), done: make(chan struct{}),
	}
}

// The line of each lease event type: its message and its event key (as leased_events_total's label).
var auditEvents = map[leasepb.EventType]struct{ msg, event string }{
	leasepb.EventType_EVENT_TYPE_GRANTED:       {"lease granted", "granted"},
	leasepb.EventType_EVENT_TYPE_RELEASED:      {"lease released", "released"},
	leasepb.EventType_EVENT_TYPE_EXPIRED:       {"lease expired", "expired"},
	leasepb.EventType_EVENT_TYPE_VALUE_CHANGED: {"lease value proclaimed", "value_changed"},
}

// Record notes the lines of the entry at index, applied with the node in role ("leader", RoleLeader, or
// "candidate" or "follower": the role key of the lines) (Ready loop). It is called for every applied normal
// entry, a new leader's empty one included, so that a node catches up the trail as soon as it applies an
// entry while leading.
func (a *AuditTrail) Record(index uint64, role string, res fsm.Result) {
	if !a.on {
		return
	}
	leading := role == RoleLeader
	if leading && !a.leading && len(a.behind) > 0 {
		for _, l := range a.behind {
			l.role, l.replayed = role, true
			a.pending = append(a.pending, l)
		}
		a.behind, a.upTo = nil, index
	}
	a.leading = leading
	if len(res.Events) == 0 && !res.Changes.ACLSet {
		return
	}
	var lines []auditLine
	if res.Changes.ACLSet {
		lines = append(lines, auditLine{role: role, aclSet: true, index: index})
	}
	for _, e := range res.Events {
		lines = append(lines, auditLine{role: role, event: e})
	}
	if leading || a.debug {
		a.pending = append(a.pending, lines...)
		a.upTo = index
	}
	if !leading {
		a.behind = append(a.behind, lines...)
		if over := len(a.behind) - auditCatchUp; over > 0 {
			a.behind = append(a.behind[:0:0], a.behind[over:]...)
		}
	}
}

// HandOff gives the lines recorded since the last hand-off to the writer (Ready loop, after each apply).
func (a *AuditTrail) HandOff() {
	if len(a.pending) == 0 {
		return
	}
	a.batches <- auditBatch{lines: a.pending, upTo: a.upTo}
	a.pending, a.handed = nil, a.upTo
}

// WaitWritten returns once every line handed over is written (Ready loop, before a snapshot).
func (a *AuditTrail) WaitWritten() {
	_ = a.written.Wait(context.Background(), a.handed, a.done)
}

// Close ends the trail: Run writes what it was handed, then returns (Ready loop, as it ends).
func (a *AuditTrail) Close() {
	a.HandOff()
	close(a.batches)
}

// Run writes the batches the loop hands over, in order, until the loop closes the trail.
func (a *AuditTrail) Run() {
	defer close(a.done)
	for b := range a.batches {
		for _, l := range b.lines {
			a.write(l)
		}
		a.written.Notify(b.upTo)
	}
}

func (a *AuditTrail) write(l auditLine) {
	ctx := context.Background()
	level := slog.LevelDebug
	if l.role == RoleLeader {
		level = slog.LevelInfo
	}
	role := slog.String("role", l.role)
	if l.replayed {
		role = slog.Group("", role, slog.Bool("replayed", true))
	}
	if l.aclSet {
		a.log.LogAttrs(ctx, level, "acl rules set",
			slog.String("event", "acl-set"), slog.Uint64("index", l.index), role)
		return
	}
	e := l.event
	a.log.LogAttrs(ctx, level, auditEvents[e.Type].msg,
		slog.String("event", auditEvents[e.Type].event),
		slog.String("resource", e.Lease.Resource),
		slog.Uint64("token", e.Lease.Token),
		slog.String("holder", e.Lease.Holder),
		slog.String("identity", e.Lease.Identity),
		slog.Uint64("index", e.Index),
		role)
	if e.By != "" {
		// An admin released another identity's lease: the second line names both.
		a.log.LogAttrs(ctx, level, "lease released by admin",
			slog.String("event", "admin-release"),
			slog.String("resource", e.Lease.Resource),
			slog.Uint64("token", e.Lease.Token),
			slog.String("identity", e.Lease.Identity),
			slog.String("admin", e.By),
			slog.Uint64("index", e.Index),
			role)
	}
}
