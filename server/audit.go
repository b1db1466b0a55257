package server

import (
	"context"
	"log/slog"

	"go.etcd.io/raft/v3"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/fsm"
)

// The audit trail (docs/operations.md, "Audit trail"): an info line per grant, release and expiry, with
// the constant keys event, resource, token, holder, identity, index and role. Every node writes it, as it
// applies the entry, with its raft role at that moment: the role of the node that applies an entry is not
// a property of the entry (across a leadership change the old and the new leader can both, or neither,
// apply it while leading), so "the leader logs" would be either incomplete or duplicated. An entry is
// identified by its index: filter on role="leader" for one copy in steady state, or deduplicate on
// index, resource and token; a node that restarts applies, and so logs, the entries after its snapshot
// again.
//
// The Ready loop only records the lines; auditTrail.run formats and writes them. Written on the loop, a
// line per grant cost the leader 8% of its CPU at 256 clients, half of it a write(2) per line, all on the
// one goroutine every commit waits for: acquires ran 16% slower at info level than at warn. The loop
// hands each Ready's lines over in one batch, in apply order; the hand-off blocks when the writer is
// 64 batches behind (a log sink that stops reading stops the node, as it did before, rather than growing
// its memory or dropping lines). A snapshot waits until every line of the entries it covers is written
// (waitWritten), so a node that crashes re-logs on restart every entry whose lines it may not have
// written: those after its snapshot.
type auditTrail struct {
	log *slog.Logger
	on  bool // info is enabled: decided once, the level does not change while a node runs

	pending []auditLine     // the lines of the Ready being applied (Ready loop only)
	upTo    uint64          // the newest index with a line in pending (Ready loop only)
	handed  uint64          // the newest index whose lines were handed over (Ready loop only)
	batches chan auditBatch // to run; closed by the loop as it ends
	written *indexWaiter    // the newest index whose lines are written
	done    chan struct{}   // closed when run returns
}

// auditLine is one entry's audit: an ACL change, or one lease event.
type auditLine struct {
	role   string
	aclSet bool
	index  uint64 // of the ACL change
	event  fsm.Event
}

type auditBatch struct {
	lines []auditLine
	upTo  uint64
}

// auditBacklog is how many batches (Readys) the writer may be behind before the loop waits for it.
const auditBacklog = 64

func newAuditTrail(log *slog.Logger, from uint64) *auditTrail {
	return &auditTrail{
		log: log, on: log.Enabled(context.Background(), slog.LevelInfo),
		batches: make(chan auditBatch, auditBacklog), written: newIndexWaiter(from), done: make(chan struct{}),
	}
}

// Audit trail messages, one per lease event type.
var auditMessages = map[leasepb.EventType]string{
	leasepb.EventType_EVENT_TYPE_GRANTED:       "lease granted",
	leasepb.EventType_EVENT_TYPE_RELEASED:      "lease released",
	leasepb.EventType_EVENT_TYPE_EXPIRED:       "lease expired",
	leasepb.EventType_EVENT_TYPE_VALUE_CHANGED: "lease value proclaimed",
}

// record notes the lines of the entry at index, applied with the node in state st (Ready loop).
func (a *auditTrail) record(index uint64, st raft.StateType, res fsm.Result) {
	if !a.on || (len(res.Events) == 0 && !res.Changes.ACLSet) {
		return
	}
	role := roleName(st)
	if res.Changes.ACLSet {
		a.pending = append(a.pending, auditLine{role: role, aclSet: true, index: index})
	}
	for _, e := range res.Events {
		a.pending = append(a.pending, auditLine{role: role, event: e})
	}
	a.upTo = index
}

// handOff gives the lines recorded since the last hand-off to the writer (Ready loop, after each apply).
func (a *auditTrail) handOff() {
	if len(a.pending) == 0 {
		return
	}
	a.batches <- auditBatch{lines: a.pending, upTo: a.upTo}
	a.pending, a.handed = nil, a.upTo
}

// waitWritten returns once every line handed over is written (Ready loop, before a snapshot).
func (a *auditTrail) waitWritten() {
	_ = a.written.wait(context.Background(), a.handed, a.done)
}

// close ends the trail: run writes what it was handed, then returns (Ready loop, as it ends).
func (a *auditTrail) close() {
	a.handOff()
	close(a.batches)
}

// run writes the batches the loop hands over, in order, until the loop closes the trail.
func (a *auditTrail) run() {
	defer close(a.done)
	for b := range a.batches {
		for _, l := range b.lines {
			a.write(l)
		}
		a.written.notify(b.upTo)
	}
}

func (a *auditTrail) write(l auditLine) {
	ctx := context.Background()
	if l.aclSet {
		a.log.LogAttrs(ctx, slog.LevelInfo, "acl rules set",
			slog.String("event", "acl-set"), slog.Uint64("index", l.index), slog.String("role", l.role))
		return
	}
	e := l.event
	a.log.LogAttrs(ctx, slog.LevelInfo, auditMessages[e.Type],
		slog.String("event", eventTypeLabel[e.Type]),
		slog.String("resource", e.Lease.Resource),
		slog.Uint64("token", e.Lease.Token),
		slog.String("holder", e.Lease.Holder),
		slog.String("identity", e.Lease.Identity),
		slog.Uint64("index", e.Index),
		slog.String("role", l.role))
	if e.By != "" {
		// An admin released another identity's lease: the second line names both.
		a.log.LogAttrs(ctx, slog.LevelInfo, "lease released by admin",
			slog.String("event", "admin-release"),
			slog.String("resource", e.Lease.Resource),
			slog.Uint64("token", e.Lease.Token),
			slog.String("identity", e.Lease.Identity),
			slog.String("admin", e.By),
			slog.Uint64("index", e.Index),
			slog.String("role", l.role))
	}
}
