// Package watch keeps the bounded history of applied events that Watch streams read, and wakes the
// streams when events they match arrive. The apply loop only appends to it (Hub.Publish) and never waits
// for a watcher; each stream reads and filters on its own goroutine (docs/design.md, "Watch").
package watch

import (
	"errors"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server/internal/errs"
)

// Hub keeps a bounded history of events, in index order, and is where every watcher reads them from
// (docs/design.md, "Watch"). The apply loop only appends to the history, shares a new view of it and
// signals the notifier; it never waits for a watcher and never copies events for one, and the hub's lock
// is taken only by it, the notifier and the rare resets. Each Watch stream keeps a cursor into the history
// and reads, filters and sends on its own goroutine, from the last shared view (the segments and the end
// of the history), without a lock: published events never change. A watcher too slow for the history —
// its cursor evicted before it read there — is cut off and resumes from the index after the last event it
// saw; a watcher that stops reading altogether pins at most the round it is blocked sending.
//
// The history is a list of segments of up to segmentEvents events each, bounded by WatchHistory events
// and WatchHistoryBytes bytes (eventBytes), whichever is reached first; the events of the newest entry
// are never evicted, so even one entry larger than the bound reaches the watchers that keep up.
type Hub struct {
	mu        sync.Mutex
	maxEvents int
	maxBytes  int64
	// maxWatchers is --max-watchers; watchers is how many are subscribed.
	maxWatchers int
	watchers    atomic.Int64
	// Identities counts the watchers of each client identity (--max-watchers-per-identity, which the
	// Watch service enforces).
	Identities IdentityCounts
	// published is the history as readers see it, replaced (never changed) under mu by every publish,
	// wake and reset: readers and new subscribers load it without the lock, so however many watchers
	// there are, the apply loop's publish never queues behind them for mu.
	published atomic.Pointer[historyView]
	segs      []*segment // oldest first; segs[0].events[head] is the oldest retained event
	// dropped counts the segments evicted since segs last moved to a fresh array (evict).
	dropped int
	head    int
	tail    int   // events in the last segment
	count   int   // retained events
	bytes   int64 // their eventBytes
	// Events are numbered by a sequence (not their index: one index has several events) that never goes
	// back, not even across reset: lo is the sequence of the oldest retained event, next of the next one
	// to be published.
	lo, next uint64
	// oldest is the smallest index a Watch may start from: events before it may be missing.
	oldest uint64
	// newest is the index of the latest entry published: its events are never evicted.
	newest uint64
	// pending (capacity 1) tells the notifier goroutine (notify) that there are new events; publishes
	// coalesce there. The notifier, not the apply loop, wakes the sleeping watchers — only those that
	// match something new, so that an event wakes its watchers, not all of them — and moves the cursors
	// of the others past what they do not match, so that an idle watcher never falls behind.
	pending  chan struct{}
	sleepMu  sync.Mutex
	sleeping map[*Watcher]chan struct{}
	// sleepers is len(sleeping), stored under sleepMu: with none, publish does not wake the notifier
	// (every node applies every entry, and most nodes serve no watcher; waking a goroutine on an idle
	// node wakes a thread). A watcher going to sleep signals after it counts itself, and publish shares
	// its view before it reads the count, so one of the two sees the other (sleep).
	sleepers atomic.Int64
	// epoch counts resets; a watcher subscribed in an earlier one is cut off. closed ends every watcher.
	epoch  uint64
	closed bool
}

// segmentEvents is the capacity of one history segment.
const segmentEvents = 256

// segment is a fixed array, never resliced: an append writes only the slot of the new event, so a reader
// may use the slots before the end it saw while later ones are written.
type segment struct {
	events [segmentEvents]fsm.Event
}

// Watcher is one Watch stream's subscription: where it reads next, and what it wants.
type Watcher struct {
	// from is the first index the watcher wants: a node replaying its log after a restart publishes
	// events older than that, which must not reach a watcher that asked to resume later.
	from   uint64
	match  func(resource string) bool
	cursor uint64 // the sequence of the next event to look at: moved by the watcher's goroutine, or by the notifier while it sleeps
	epoch  uint64
}

// Why a watcher's read ended (errWatchFellBehind maps to ResourceExhausted, as it always has: the SDK
// resumes on it).
var (
	errWatchFellBehind = errors.New("watch fell behind the retained history")
	errWatchReset      = errors.New("this node replaced its state from a snapshot and dropped its watch history")
)

// eventBytes is what one event costs the history: the event itself and the bytes it references.
func eventBytes(e *fsm.Event) int64 {
	l := &e.Lease
	return int64(unsafe.Sizeof(*e)) + int64(len(l.Resource)+len(l.Holder)+len(l.Value)+len(l.RequestID))
}

// New returns an empty history of at most maxEvents events and maxBytes bytes (eventBytes) that serves
// at most maxWatchers watchers, whose first retained index is oldest.
func New(maxEvents int, maxBytes int64, maxWatchers int, oldest uint64) *Hub {
	h := &Hub{maxEvents: maxEvents, maxBytes: maxBytes, maxWatchers: maxWatchers, oldest: oldest,
		pending: make(chan struct{}, 1), sleeping: make(map[*Watcher]chan struct{})}
	h.share()
	return h
}

// share publishes the history's current state to readers. Called with mu held.
func (h *Hub) share() {
	h.published.Store(&historyView{segs: h.segs, head: h.head, lo: h.lo, hi: h.next, oldest: h.oldest,
		epoch: h.epoch, closed: h.closed})
}

// Matcher matches a Watch request's resource, or with none its prefix.
func Matcher(resource, prefix string) func(string) bool {
	if resource != "" {
		return func(r string) bool { return r == resource }
	}
	return func(r string) bool { return strings.HasPrefix(r, prefix) }
}

// Publish records the events of one applied entry for the watchers and tells the notifier. It is the
// apply loop's only work for watchers: an append, an eviction, a send that never blocks.
func (h *Hub) Publish(index uint64, events []fsm.Event) {
	if len(events) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	for i := range events {
		h.append(events[i])
	}
	h.newest = index
	h.evict()
	h.share()
	if h.sleepers.Load() > 0 {
		h.signal()
	}
}

// signal tells the notifier to look at the history (never blocks).
func (h *Hub) signal() {
	select {
	case h.pending <- struct{}{}:
	default: // the notifier has yet to look since an earlier signal: it will see this one's events too
	}
}

// Notify wakes the sleeping watchers after publishes until stop closes (Server.Start runs it), off the
// apply loop and outside the lock publish takes.
func (h *Hub) Notify(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-h.pending:
			h.round()
		}
	}
}

// round wakes each sleeping watcher that has a new matching event (or must end: a reset, a shutdown, a
// cursor evicted), and moves the others' cursors to the end of the history. A sleeping watcher's cursor
// is the notifier's until it is woken or leaves (both under sleepMu).
func (h *Hub) round() {
	v := h.published.Load()
	h.sleepMu.Lock()
	defer h.sleepMu.Unlock()
	for w, wake := range h.sleeping {
		if !v.closed && w.epoch == v.epoch && w.cursor >= v.lo {
			for ; w.cursor < v.hi; w.cursor++ {
				if e := v.at(w.cursor); e.Index >= w.from && w.match(e.Lease.Resource) {
					break
				}
			}
			if w.cursor == v.hi {
				continue // nothing for it yet
			}
		}
		delete(h.sleeping, w)
		close(wake)
	}
	h.sleepers.Store(int64(len(h.sleeping)))
}

// Sleep parks w until the notifier has something for it; leave (safe to call more than once, and after
// the wake) takes it out. w must not be read meanwhile.
func (h *Hub) Sleep(w *Watcher) (wake <-chan struct{}, leave func()) {
	ch := make(chan struct{})
	h.sleepMu.Lock()
	h.sleeping[w] = ch
	h.sleepers.Store(int64(len(h.sleeping)))
	h.sleepMu.Unlock()
	// Events published before w went to sleep may have been looked at by the notifier already.
	h.signal()
	return ch, func() {
		h.sleepMu.Lock()
		delete(h.sleeping, w)
		h.sleepers.Store(int64(len(h.sleeping)))
		h.sleepMu.Unlock()
	}
}

func (h *Hub) append(e fsm.Event) {
	if len(h.segs) == 0 || h.tail == segmentEvents {
		h.segs = append(h.segs, new(segment))
		h.tail = 0
	}
	slot := &h.segs[len(h.segs)-1].events[h.tail]
	*slot = e
	h.tail++
	h.count++
	h.bytes += eventBytes(slot)
	h.next++
}

// evict drops the oldest events while the history is over either bound, but never the newest entry's.
func (h *Hub) evict() {
	for h.count > 0 && (h.count > h.maxEvents || h.bytes > h.maxBytes) {
		if h.head == segmentEvents { // segs[0] is evicted to its end, and a later one holds the rest
			h.segs, h.head = h.segs[1:], 0 // not nil-ed first: views share the array
			// The array's slots before segs still hold the evicted segments, and their events' names,
			// until append moves it: up to as many again as the history retains. Move it sooner.
			if h.dropped++; h.dropped > len(h.segs)/4 {
				h.segs, h.dropped = slices.Clone(h.segs), 0
			}
		}
		e := &h.segs[0].events[h.head]
		if e.Index >= h.newest {
			return
		}
		h.bytes -= eventBytes(e)
		h.count--
		h.lo++
		h.head++
		h.oldest = max(h.oldest, e.Index+1)
	}
}

// Subscribe registers a watcher of the events with index >= from that match, starting with those still
// retained. from == 0 means "from now": from the index after next, the first index not yet committed when
// the watch began. It fails with an errs.Compacted when from is older than the retained history, and with
// an errs.Limit past --max-watchers.
func (h *Hub) Subscribe(from, next uint64, match func(string) bool) (*Watcher, error) {
	if h.watchers.Add(1) > int64(h.maxWatchers) {
		h.watchers.Add(-1)
		return nil, errs.Limited("--max-watchers", "this node serves %d watchers, the most it may", h.maxWatchers)
	}
	v := h.published.Load()
	var err error
	switch {
	case v.closed:
		err = errs.ErrStopped
	case from != 0 && from < v.oldest:
		err = &errs.Compacted{Oldest: v.oldest}
	}
	if err != nil {
		h.watchers.Add(-1)
		return nil, err
	}
	w := &Watcher{from: from, match: match, cursor: v.hi, epoch: v.epoch}
	if from == 0 {
		w.from = next
	} else {
		w.cursor = v.seek(from)
	}
	return w, nil
}

// historyView is the history as a reader saw it under the lock: it stays valid after the lock is
// released, since retained events never change and eviction only drops references.
type historyView struct {
	segs   []*segment
	head   int
	lo, hi uint64
	oldest uint64
	// epoch and closed are the hub's when this view was shared.
	epoch  uint64
	closed bool
}

// seek is the sequence of the first retained event with index >= from (events are in index order, but
// for a node replaying its log, whose replayed events the watcher's from filters out).
func (v historyView) seek(from uint64) uint64 {
	n := sort.Search(int(v.hi-v.lo), func(i int) bool { return v.at(v.lo+uint64(i)).Index >= from })
	return v.lo + uint64(n)
}

func (v historyView) at(seq uint64) *fsm.Event {
	pos := v.head + int(seq-v.lo)
	return &v.segs[pos/segmentEvents].events[pos%segmentEvents]
}

// Read returns the next events w matches, up to about maxBytes of them (at least one), and moves its
// cursor past them; with nothing new, none (sleep then waits for some). It fails when w fell behind the
// history, the history was reset, or the hub closed.
func (h *Hub) Read(w *Watcher, maxBytes int64) ([]fsm.Event, error) {
	v, err := h.view(w)
	if err != nil || v.hi == w.cursor {
		return nil, err
	}
	var (
		out  []fsm.Event
		size int64
	)
	// Scan a bounded stretch per call, so that a watcher that matches little of a long history still
	// returns (and notices its stream ending) between stretches.
	end := min(v.hi, w.cursor+4*segmentEvents)
	for ; w.cursor < end && (size < maxBytes || len(out) == 0); w.cursor++ {
		if e := v.at(w.cursor); e.Index >= w.from && w.match(e.Lease.Resource) {
			out = append(out, *e)
			size += eventBytes(e)
		}
	}
	return out, nil
}

// view is the history as last shared, for w to read; it takes no lock.
func (h *Hub) view(w *Watcher) (*historyView, error) {
	v := h.published.Load()
	switch {
	case v.closed:
		return nil, errs.ErrStopped
	case w.epoch != v.epoch:
		return nil, errWatchReset
	case w.cursor < v.lo:
		return nil, errWatchFellBehind
	}
	return v, nil
}

// Len is the number of subscribed watchers (leased_watchers).
func (h *Hub) Len() int {
	return int(h.watchers.Load())
}

// Retained is the number and bytes of the events in the history.
func (h *Hub) Retained() (int, int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.count, h.bytes
}

func (h *Hub) Unsubscribe(*Watcher) { h.watchers.Add(-1) }

// Reset drops the history after a snapshot restore: events before oldest are unknown to this node, and
// every watcher is cut off (it resumes, here or elsewhere, from its next index).
func (h *Hub) Reset(oldest uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.segs, h.dropped, h.head, h.tail, h.count, h.bytes = nil, 0, 0, 0, 0, 0
	h.lo, h.oldest = h.next, oldest
	h.epoch++
	h.share()
	h.signal()
}

// CloseAll ends every watcher and refuses new ones (shutdown).
func (h *Hub) CloseAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.closed {
		h.closed = true
		h.share()
		h.signal()
	}
}

// From is the first index w wants.
func (w *Watcher) From() uint64 { return w.from }

// IdentityCounts counts what each identity holds; the zero value is ready to use.
type IdentityCounts struct {
	mu sync.Mutex
	n  map[string]int
}

// Take counts one more for id unless id holds limit already; it reports whether it did.
func (c *IdentityCounts) Take(id string, limit int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[id] >= limit {
		return false
	}
	if c.n == nil {
		c.n = make(map[string]int)
	}
	c.n[id]++
	return true
}

// Put gives back one that Take counted.
func (c *IdentityCounts) Put(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[id]--; c.n[id] <= 0 {
		delete(c.n, id)
	}
}
