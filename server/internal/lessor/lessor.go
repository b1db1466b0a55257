// Package lessor keeps each live lease's deadline on the node's monotonic clock and, on the leader, decides
// expirations, idle checkpoints and lock-delay ends (decision 3). It sees the state machine only through the
// results of applied entries and talks back only through the channel of commands it decides (Cmd), which
// the node proposes; it knows nothing of raft, the network or the disk.
package lessor

import (
	"cmp"
	"container/heap"
	"errors"
	"math"
	"slices"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server/internal/errs"
)

// Lessor keeps each live lease's deadline on this node's monotonic clock (decision 3). Every node tracks
// the leases as they apply, with the time it applied each lease's last checkpoint, so that it can take over;
// only the leader acts: it expires leases whose deadline passed, checkpoints leases that went idle, ends
// lock-delays, and resets deadlines on renewal (decision 4: in memory, no log entry, after a ReadIndex).
//
// The bound on a dead holder's lease under leadership churn: a new leader gives a full TTL only to leases
// the log does not mark idle, and counts its takeover as their renewal; every scan period (interval/4) it
// checkpoints as idle, with its remaining TTL, each lease whose last renewal (or the takeover) is at least
// interval - scan old, so the idle mark is in the log within one CheckpointInterval of the last renewal,
// and later leaders honour it. So a lease whose holder died is expired within TTL + CheckpointInterval +
// election gap (docs/design.md, "The lessor"), plus, when a mass disconnect's checkpoints take longer to
// apply than the scan period (the node's proposer paces them), the rest of that time.
//
// An idle checkpoint decided but not yet applied counts as idle for renewals: a renewal acknowledged from
// memory after the checkpoint was decided would be undone by it (its remainder predates the renewal), so
// such a renewal goes through the log, as the first renewal of an idle lease does.
type Lessor struct {
	mu       sync.Mutex
	interval time.Duration // checkpoint interval: an idle lease is marked so in the log within it
	scan     time.Duration // how often the leader looks for leases gone idle
	retry    time.Duration // re-propose an expiry or checkpoint not applied within this
	batch    int
	out      chan<- Cmd
	// expiries is the expiry rate's budget (expiryBudget): leases this leader may still propose to expire.
	expiries expiryBudget

	leader bool
	term   uint64 // the raft term this node leads in; tags every command it decides
	// gen changes whenever the timers may be other objects or other deadlines rule (reset, promote,
	// demote): a batch of renewals checked under one gen is renewed through the timers it found only
	// under the same (RenewChecked).
	gen uint64
	// timers holds a timer for each lease, found by token: tokens are unique (one grant per entry,
	// decision 1), so the token alone names a lease; current checks the resource too. A token key
	// hashes no string: renewals look leases up by the thousand.
	timers    timerSlab
	deadlines timerHeap
	delays    map[string]*delayTimer
	base      time.Time // origin of the leases' mono readings
	lastScan  time.Time
	// checkpointsApplied is when a checkpoint this leader proposed last applied, and checkpointsProposed
	// the latest proposal time of one that applied (checkpointLost).
	checkpointsApplied, checkpointsProposed mono

	// expiryLag, when set (RegisterMetrics), hears how late after its deadline each lease this leader expired was expired
	// (leased_expiry_lag_seconds). Called with mu held.
	expiryLag func(seconds float64)
}

// Cmd is a command the lessor decided while leading in Term. It must reach the log only from the
// same node still leading in the same term (the node's proposer checks): decided in an earlier term, a
// checkpoint's remainder or an expiry may predate renewals another leader acknowledged since.
type Cmd struct {
	Term uint64
	Cmd  *wirepb.Command
	// Batch, when set, says Cmd (an Expire or a Checkpoint) names all the leases of one decision: the
	// proposer sorts them by name and proposes them in entries of at most Batch (Entries), off the Ready
	// loop, where sorting a mass disconnect's worth (100,000 names: 30-50 ms) would stall it.
	Batch int
}

// mono is a reading of the lessor's clock as an offset from lessor.base: 8 bytes per lease, not a
// time.Time's 24. A node holds a leaseTimer per lease (a million of them), so every instant in it is one.
type mono int64

// at converts a reading of the node's clock; the first one fixes base. Called with l.mu held.
func (l *Lessor) at(now time.Time) mono {
	if l.base.IsZero() {
		l.base = now
	}
	return mono(now.Sub(l.base))
}

// add converts a duration after reading m, saturating rather than overflowing.
func (m mono) add(d time.Duration) mono {
	if d > 0 && m > math.MaxInt64-mono(d) {
		return math.MaxInt64
	}
	return m + mono(d)
}

// leaseTimer is the lessor's view of one lease: 72 bytes, kept so by holding every instant as a mono, the
// two checkpoint fields as the one instant they are used for, and an expiring lease's deadline as it was
// when the expiry was proposed (its retry waits in the heap).
type leaseTimer struct {
	resource string
	token    uint64
	ttl      time.Duration
	// deadline is when the lease expires, valid while this node leads; once expiring, when it expired.
	deadline mono
	// renewedAt is when the lease was last granted, renewed, or taken over by this leader (leader only).
	renewedAt mono
	// checkpointedAt is when this leader proposed an idle checkpoint for the lease; checkpointing is set
	// until a checkpoint for it applies (or this node takes over again: startDeadlines clears it).
	checkpointedAt mono
	// checkpointEnd is when this node applied the lease's last checkpoint plus the remaining TTL it
	// recorded: the deadline a new leader gives the lease while it is idle.
	checkpointEnd mono
	heapIdx       int32
	checkpointing bool
	// idle mirrors the FSM: checkpointed as not renewed, so the next renewal must be made durable.
	idle bool
	// expiring is set once an Expire was proposed: renewals are refused from then on.
	expiring bool
}

// holds reports whether t still is the timer of the lease with token: a renewal batch keeps the timers
// it checked across the lessor's lock, and the lease may have left meanwhile (released, expired or
// replaced), its slot freed (token 0) or reused by another lease (another token: tokens are unique).
func (t *leaseTimer) holds(token uint64) bool { return t.token == token }

// A leaseTimer is one slot of the slab, 72 bytes for each lease a node holds: this fails to compile if
// it grows past them.
var _ [72 - unsafe.Sizeof(leaseTimer{})]struct{}

type delayTimer struct {
	token    uint64
	end      time.Time
	proposed time.Time
}

// Config is what the lessor needs of the node's configuration.
type Config struct {
	// CheckpointInterval: an idle lease is marked so in the log within it (--checkpoint-interval).
	CheckpointInterval time.Duration
	// Retry: an expiry or checkpoint not applied within it is proposed again (the node uses two election
	// timeouts).
	Retry time.Duration
	// ExpiryBatch is the most leases one Expire or Checkpoint entry names (--expiry-batch); ExpiryRate the
	// leases a second the leader proposes to expire (--expiry-rate).
	ExpiryBatch, ExpiryRate int
}

// New returns a follower's lessor that hands the commands it decides to out.
func New(cfg Config, out chan<- Cmd) *Lessor {
	return &Lessor{
		interval: cfg.CheckpointInterval,
		scan:     cfg.CheckpointInterval / 4,
		retry:    cfg.Retry,
		batch:    cfg.ExpiryBatch,
		out:      out,
		expiries: newExpiryBudget(cfg.ExpiryRate, cfg.ExpiryBatch),
		delays:   make(map[string]*delayTimer),
	}
}

// Reset rebuilds the lessor from a state machine (at start, or after restoring a snapshot). Checkpoint
// times are unknown, so they count from now: later, never earlier, than the old leader's deadlines.
func (l *Lessor) Reset(sm *fsm.FSM, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.gen++
	l.timers = timerSlab{} // timers a renewal batch still holds stay valid; the gen sends it to look again
	l.deadlines = l.deadlines[:0]
	sm.Ascend(func(ls fsm.Lease) bool {
		l.timers.add(leaseTimer{
			resource: ls.Resource, token: ls.Token, ttl: Millis(ls.TTLMs),
			idle:          ls.Checkpointed && !ls.Renewed,
			checkpointEnd: l.at(now).add(Millis(ls.RemainingMs)),
		})
		return true
	})
	l.delays = make(map[string]*delayTimer)
	for _, d := range sm.LockDelays() {
		l.delays[d.Resource] = &delayTimer{token: d.Token, end: now.Add(Millis(d.DelayMs))}
	}
	if l.leader {
		l.startDeadlines(now)
	}
}

// Promote makes this node's lessor active after it became leader in term.
func (l *Lessor) Promote(now time.Time, term uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.leader, l.term = true, term
	l.gen++
	l.startDeadlines(now)
}

// startDeadlines sets every deadline as a new leader must: a full TTL for leases that may have been
// renewed (the takeover counts as their renewal, so their idle mark follows within an interval), the
// checkpointed remainder (from when this node applied the checkpoint) for idle ones.
func (l *Lessor) startDeadlines(now time.Time) {
	l.deadlines = slices.Grow(l.deadlines[:0], l.timers.len()) // one allocation, not a doubling series
	cur := l.at(now)
	l.timers.each(func(t *leaseTimer) {
		if t.idle {
			t.deadline = t.checkpointEnd
		} else {
			t.deadline, t.renewedAt = cur.add(t.ttl), cur
		}
		t.checkpointing, t.expiring = false, false
		t.heapIdx = int32(len(l.deadlines))
		l.deadlines = append(l.deadlines, queuedTimer{at: t.deadline, t: t})
	})
	heap.Init(&l.deadlines)
	l.lastScan = now
	for _, d := range l.delays {
		d.proposed = time.Time{}
	}
}

func (l *Lessor) Demote() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.leader = false
	l.gen++
	l.deadlines = l.deadlines[:0]
}

// Extend pushes every deadline back by a stall of the leader's loop.
func (l *Lessor) Extend(gap time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.leader {
		return
	}
	l.timers.each(func(t *leaseTimer) { t.deadline = t.deadline.add(gap) })
	for i := range l.deadlines {
		l.deadlines[i].at = l.deadlines[i].at.add(gap) // a uniform shift keeps the heap ordered
	}
	for _, d := range l.delays {
		d.end = d.end.Add(gap)
	}
}

// Applied updates the lessor with the result of one applied entry. Called by the Ready loop. The FSM
// decided which leases and lock-delays the entry changed; the lessor follows, without checking again.
func (l *Lessor) Applied(now time.Time, res fsm.Result) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range res.Events {
		switch e.Type {
		case leasepb.EventType_EVENT_TYPE_GRANTED:
			l.add(now, e.Lease)
		case leasepb.EventType_EVENT_TYPE_RELEASED, leasepb.EventType_EVENT_TYPE_EXPIRED:
			if t := l.current(e.Lease.Resource, e.Lease.Token); e.Type == leasepb.EventType_EVENT_TYPE_EXPIRED &&
				l.leader && t != nil && t.expiring && l.expiryLag != nil {
				l.expiryLag(time.Duration(l.at(now) - t.deadline).Seconds())
			}
			l.remove(e.Lease.Resource, e.Lease.Token)
		}
	}
	ch := res.Changes
	for _, d := range ch.DelaysStarted {
		l.delays[d.Resource] = &delayTimer{token: d.Token, end: now.Add(Millis(d.DelayMs))}
	}
	for _, cp := range ch.Checkpointed {
		if t := l.current(cp.Resource, cp.Token); t != nil {
			t.checkpointEnd, t.idle = l.at(now).add(Millis(cp.RemainingMs)), !cp.Renewed
			if t.checkpointing {
				t.checkpointing, l.checkpointsApplied = false, l.at(now)
				l.checkpointsProposed = max(l.checkpointsProposed, t.checkpointedAt)
			}
		}
	}
	for _, r := range ch.Renewed {
		l.durablyRenewed(now, r)
	}
	for _, d := range ch.DelaysEnded {
		delete(l.delays, d.Resource)
	}
}

// durablyRenewed records a Renew entry for one lease. A durable renewal is a renewal: the next checkpoint
// must not mark the lease idle again before the renewing call resets its deadline.
func (l *Lessor) durablyRenewed(now time.Time, ref fsm.Ref) {
	t := l.current(ref.Resource, ref.Token)
	if t == nil {
		return
	}
	t.idle, t.renewedAt = false, l.at(now)
	if l.leader && !t.expiring && l.queued(t) {
		// The renewal may have been acknowledged by the previous leader, after this node took over with
		// the lease counted as idle: it earns a full TTL from now.
		t.deadline = max(t.deadline, l.at(now).add(t.ttl)) // the heap catches up lazily (expireDue)
	}
}

func (l *Lessor) add(now time.Time, ls fsm.Lease) {
	cur := l.at(now)
	if old := l.timers.get(ls.Token); old != nil { // not from the log (tokens are unique), but never leak a slot
		l.remove(old.resource, old.token)
	}
	t := l.timers.add(leaseTimer{
		resource: ls.Resource, token: ls.Token, ttl: Millis(ls.TTLMs),
		deadline: cur.add(Millis(ls.TTLMs)), renewedAt: cur, checkpointEnd: cur.add(Millis(ls.TTLMs)), heapIdx: -1,
	})
	if l.leader {
		heap.Push(&l.deadlines, queuedTimer{at: t.deadline, t: t})
	}
}

func (l *Lessor) remove(resource string, token uint64) {
	t := l.current(resource, token)
	if t == nil {
		return
	}
	if l.leader && l.queued(t) {
		heap.Remove(&l.deadlines, int(t.heapIdx))
	}
	l.timers.remove(t)
	if l.timers.sparse() {
		l.compactTimers()
	}
}

// compactTimers moves the timers into a fresh slab, with its own token index, and repoints the deadline
// heap. The gen changes: a renewal batch checked before holds timers of the old slab, and looks its
// leases up again.
func (l *Lessor) compactTimers() {
	old := l.timers
	l.timers = timerSlab{}
	l.gen++
	old.each(func(t *leaseTimer) {
		moved := l.timers.add(*t)
		if l.leader && l.queued(t) {
			l.deadlines[t.heapIdx].t = moved
		}
	})
}

// queued reports whether t is in the deadline heap.
func (l *Lessor) queued(t *leaseTimer) bool {
	return t.heapIdx >= 0 && int(t.heapIdx) < len(l.deadlines) && l.deadlines[t.heapIdx].t == t
}

func (l *Lessor) current(resource string, token uint64) *leaseTimer {
	if t := l.timers.get(token); t != nil && t.resource == resource {
		return t
	}
	return nil
}

// Tick does the leader's periodic work: propose expirations, checkpoints and lock-delay ends.
func (l *Lessor) Tick(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.leader {
		return
	}
	l.expireDue(now)
	l.endDelays(now)
	if now.Sub(l.lastScan) >= l.scan {
		l.checkpoint(now)
		l.lastScan = now
	}
}

// expireDue proposes the expiry of leases whose deadline passed, the most overdue first, as many as the
// expiry rate's budget allows; the rest wait in the heap for the next tick.
func (l *Lessor) expireDue(now time.Time) {
	var refs []*leasepb.LeaseRef
	cur := l.at(now)
	budget, proposed := l.expiries.refill(now), 0
	for len(l.deadlines) > 0 && l.deadlines[0].at <= cur && proposed < budget {
		t := l.deadlines[0].t
		if t.deadline > l.deadlines[0].at { // renewed since it was queued: requeue at its deadline
			l.deadlines[0].at = t.deadline
			heap.Fix(&l.deadlines, 0)
			continue
		}
		proposed++
		t.expiring = true
		// Keep it queued in case the proposal is lost; it is removed when the expiry applies. Its deadline
		// stays when it expired: no renewal moves it now, and the requeue above does not apply.
		l.deadlines[0].at = cur.add(l.retry)
		heap.Fix(&l.deadlines, 0)
		refs = append(refs, &leasepb.LeaseRef{Resource: t.resource, Token: t.token})
	}
	if len(refs) > 0 {
		l.sendSplit(&wirepb.Command{Op: &wirepb.Command_Expire{Expire: &wirepb.ExpireCmd{Leases: refs}}})
	}
	l.expiries.spend(proposed)
}

// expiryBudget is a token bucket of expiries: rate leases a second, up to burst at once. Every node
// applies every expiry, and a mass disconnect (hundreds of thousands of leases whose holders went at
// once) proposed in one go was applied in one Ready, each node's loop busy with it for most of a second
// (no ticks, heartbeats or client writes meanwhile). At the rate the expiries come a few batches a tick,
// between the clients' writes. An expiry late by the budget is safe (the holder's SDK stopped trusting
// the lease at its own deadline; the resource is regranted later); leased_expiry_lag_seconds shows it.
type expiryBudget struct {
	rate, burst float64
	left        float64
	at          time.Time // when left was last refilled (zero: full)
}

// newExpiryBudget allows rate leases a second in bursts of a tenth of a second's worth, at least one
// batch, starting full.
func newExpiryBudget(rate, batch int) expiryBudget {
	burst := max(float64(rate)/10, float64(batch))
	return expiryBudget{rate: float64(rate), burst: burst, left: burst}
}

// refill adds what the rate earned since the last refill and returns the budget, in whole leases.
func (b *expiryBudget) refill(now time.Time) int {
	if !b.at.IsZero() && now.After(b.at) {
		b.left = min(b.burst, b.left+b.rate*now.Sub(b.at).Seconds())
	}
	b.at = now
	return int(b.left)
}

// spend takes n leases' worth from the budget (n at most what refill returned).
func (b *expiryBudget) spend(n int) { b.left -= float64(n) }

func (l *Lessor) endDelays(now time.Time) {
	var refs []*leasepb.LeaseRef
	for resource, d := range l.delays {
		if d.end.After(now) || (!d.proposed.IsZero() && now.Sub(d.proposed) < l.retry) {
			continue
		}
		d.proposed = now
		refs = append(refs, &leasepb.LeaseRef{Resource: resource, Token: d.token})
	}
	if len(refs) > 0 {
		l.send(&wirepb.Command{Op: &wirepb.Command_EndLockDelay{EndLockDelay: &wirepb.EndLockDelayCmd{Delays: refs}}})
	}
}

// checkpoint marks idle, with its remaining TTL, every lease not renewed (nor granted, nor taken over)
// for at least interval - scan and not yet idle in the log; scanned every scan period, each is marked
// within one interval. Leases renewed since need no entry: the log already says "renewed", which is still
// true; idle leases need none either: their checkpointed remainder still holds. A checkpoint lost before
// reaching the log (a full queue, a refused proposal) is proposed again (checkpointLost).
func (l *Lessor) checkpoint(now time.Time) {
	var cps []*wirepb.LeaseCheckpoint
	cur, idleAfter := l.at(now), mono(l.interval-l.scan)
	l.timers.each(func(t *leaseTimer) {
		switch {
		case t.idle || t.expiring || cur-t.renewedAt < idleAfter:
			return
		case t.checkpointing && !l.checkpointLost(t, cur):
			return
		}
		t.checkpointing, t.checkpointedAt = true, cur
		cps = append(cps, &wirepb.LeaseCheckpoint{
			Resource: t.resource, Token: t.token, RemainingMs: time.Duration(max(t.deadline-cur, 0)).Milliseconds(),
		})
	})
	if len(cps) > 0 {
		l.sendSplit(&wirepb.Command{Op: &wirepb.Command_Checkpoint{Checkpoint: &wirepb.CheckpointCmd{Leases: cps}}})
	}
}

// checkpointLost reports whether the idle checkpoint proposed for t will not apply. The lessor's commands
// reach the log in the order it sent them (one channel, one proposer), so once a checkpoint proposed
// later applied, an earlier one still pending was lost. A checkpoint is also taken for lost when it is
// older than l.retry and none applied for as long (the queue lost them all, or the log stalled). Merely
// old is not enough: a leader that takes over a million leases checkpoints them all at once, a thousand
// entries that may take longer than l.retry to apply, and re-proposing those each scan would add a
// thousand more each time, faster than they apply, until no client's write applied again.
func (l *Lessor) checkpointLost(t *leaseTimer, cur mono) bool {
	if t.checkpointedAt < l.checkpointsProposed {
		return true
	}
	return cur-t.checkpointedAt >= mono(l.retry) && cur-l.checkpointsApplied >= mono(l.retry)
}

// send hands a command, tagged with this leader's term, to the proposer without blocking the Ready loop;
// a dropped expiry or checkpoint is retried after l.retry.
func (l *Lessor) send(cmd *wirepb.Command) { l.Send(Cmd{Term: l.term, Cmd: cmd}) }

// sendSplit sends an Expire or Checkpoint naming every lease of one decision, for the proposer to sort
// and split into entries of at most the expiry batch (Cmd.Entries).
func (l *Lessor) sendSplit(cmd *wirepb.Command) {
	l.Send(Cmd{Term: l.term, Cmd: cmd, Batch: l.batch})
}

// Send hands c to the proposer without blocking, beside the lessor's own commands (the node's initial
// ACL goes this way too); it reports whether the queue took it.
func (l *Lessor) Send(c Cmd) bool {
	select {
	case l.out <- c:
		return true
	default:
		return false
	}
}

// Entries is what c proposes: c.Cmd, or, with a Batch, its leases sorted by name in entries of at most
// batch. By name because every node finds each lease in its B-tree by name, and lookups in name order
// go down paths still in cache from the previous one; in the order the lessor finds them (its map's, or
// the deadlines') each lookup was a string of cache misses: 1.6 µs of every node's loop a lease at 100,000
// leases (docs/benchmarks.md, "Checkpoints in place, in name order"). The leader sorts once for all nodes.
// The order among one decision's leases means nothing to the lessor (checkpointLost compares decisions).
func (c Cmd) Entries() []*wirepb.Command {
	if c.Batch <= 0 {
		return []*wirepb.Command{c.Cmd}
	}
	var out []*wirepb.Command
	switch op := c.Cmd.GetOp().(type) {
	case *wirepb.Command_Expire:
		refs := op.Expire.GetLeases()
		sortByName(refs, func(r *leasepb.LeaseRef) (string, uint64) { return r.Resource, r.Token })
		for batch := range slices.Chunk(refs, c.Batch) {
			out = append(out, &wirepb.Command{Op: &wirepb.Command_Expire{Expire: &wirepb.ExpireCmd{Leases: batch}}})
		}
	case *wirepb.Command_Checkpoint:
		cps := op.Checkpoint.GetLeases()
		sortByName(cps, func(c *wirepb.LeaseCheckpoint) (string, uint64) { return c.Resource, c.Token })
		for batch := range slices.Chunk(cps, c.Batch) {
			out = append(out, &wirepb.Command{Op: &wirepb.Command_Checkpoint{Checkpoint: &wirepb.CheckpointCmd{Leases: batch}}})
		}
	default:
		out = append(out, c.Cmd)
	}
	return out
}

// sortByName sorts items by (resource, token), the names read once into a slice of keys beside their
// positions: the comparisons then read the keys in order instead of chasing each item's pointer, which
// made up a third of the sort of a million checkpoints (BenchmarkCheckpointEntries).
func sortByName[T any](items []T, name func(T) (string, uint64)) {
	type key struct {
		resource string
		token    uint64
		at       int
	}
	keys := make([]key, len(items))
	for i, it := range items {
		keys[i].resource, keys[i].token = name(it)
		keys[i].at = i
	}
	slices.SortFunc(keys, func(a, b key) int { return compareRefs(a.resource, a.token, b.resource, b.token) })
	sorted := make([]T, len(items))
	for i, k := range keys {
		sorted[i] = items[k.at]
	}
	copy(items, sorted)
}

func compareRefs(resA string, tokA uint64, resB string, tokB uint64) int {
	if c := strings.Compare(resA, resB); c != 0 {
		return c
	}
	return cmp.Compare(tokA, tokB)
}

// ErrIdle: the lease was marked idle after the renewal was checked; it must be renewed durably first.
var ErrIdle = errors.New("lease marked idle")

// Renewal is one lease of a batch of renewals: checked before the leadership confirmation
// (CheckRenewals), renewed after it (RenewChecked) through the timer the check found, so that a renewal
// costs one lookup, not two (each was a tenth of the leader's CPU under batched renewals).
type Renewal struct {
	Resource string
	Token    uint64
	t        *leaseTimer // the timer found by the check; nil: not current when checked
	// Idle: the first renewal of an idle lease, or of one an idle checkpoint is on its way for: make it
	// durable (a Renew entry) before acknowledging.
	Idle bool
	// The outcome (RenewChecked): the TTL granted, or errs.ErrNotCurrent or ErrIdle.
	TTL time.Duration
	Err error
}

// CheckRenewals checks every renewal of batch under one lock and returns the lessor's gen, for
// RenewChecked. A lease not current is decided only after the confirmation: a node that just took over
// may not have applied a grant its predecessor acknowledged.
func (l *Lessor) CheckRenewals(batch []Renewal) (gen uint64, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.leader {
		return 0, errs.ErrNotLeader
	}
	for i := range batch {
		c := &batch[i]
		if t := l.current(c.Resource, c.Token); t != nil && !t.expiring {
			c.t, c.Idle = t, t.idle || t.checkpointing
		}
	}
	return l.gen, nil
}

// RenewChecked resets the deadline of every lease of batch to at + TTL, or says why not in its err. The
// caller has confirmed leadership after the requests arrived, and at is no earlier than that
// confirmation. A timer the check found is used as it is unless the lease left since; when the gen
// changed (a leader change, a restore), and for leases not current when checked, it looks again.
func (l *Lessor) RenewChecked(gen uint64, batch []Renewal, at time.Time) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.leader {
		return errs.ErrNotLeader
	}
	cur, fresh := l.at(at), gen != l.gen
	for i := range batch {
		c := &batch[i]
		t := c.t
		if t == nil || fresh {
			t = l.current(c.Resource, c.Token)
		}
		switch {
		case t == nil || !t.holds(c.Token) || t.expiring:
			c.Err = errs.ErrNotCurrent
		case t.idle || t.checkpointing:
			c.Err = ErrIdle // a checkpoint marked (or will mark) it idle meanwhile: renew it through the log first
		default:
			t.deadline = max(t.deadline, cur.add(t.ttl)) // the heap catches up lazily (expireDue)
			t.renewedAt = cur
			c.TTL, c.Err = t.ttl, nil
		}
	}
	return nil
}

// Remaining is the leader's view of the time left on a lease (0 when unknown or not leader).
func (l *Lessor) Remaining(resource string, token uint64, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.current(resource, token)
	if !l.leader || t == nil {
		return 0
	}
	return time.Duration(max(t.deadline-l.at(now), 0))
}

// DelayRemaining is the time left on a resource's lock-delay, as this node counts it.
func (l *Lessor) DelayRemaining(resource string, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if d, ok := l.delays[resource]; ok {
		return max(d.end.Sub(now), 0)
	}
	return 0
}

// Millis converts milliseconds from the log to a Duration, saturating instead of overflowing: the edge never
// lets a TTL or lock-delay past its (hour-scale) maximum, but an entry written by a faulty or older
// proposer must not wrap around to a short or negative deadline. maxMs is about 146 years, short enough
// that adding it to a clock reading does not overflow either.
func Millis(v int64) time.Duration {
	const maxMs = int64(math.MaxInt64/2) / int64(time.Millisecond)
	return time.Duration(min(max(v, -maxMs), maxMs)) * time.Millisecond
}
