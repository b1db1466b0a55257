package server

import (
	"errors"
	"sort"
	"strings"
	"sync"
	"unsafe"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/fsm"
)

// watchHub keeps a bounded history of events, in index order, and is where every watcher reads them from
// (docs/design.md, "Watch"). The apply loop only appends to the history and wakes the readers; it never
// waits for a watcher, never copies events for one, and holds the hub's lock for as long as an append
// takes. Each Watch stream keeps a cursor into the history and reads, filters and sends on its own
// goroutine, holding the lock only to take a view (the segments and the end of the history): published
// events never change, so the view is read without it. A watcher too slow for the history — its cursor
// evicted before it read there — is cut off and resumes from the index after the last event it saw; a
// watcher that stops reading altogether pins at most the message it is blocked sending.
//
// The history is a list of segments of up to segmentEvents events each, bounded by WatchHistory events
// and WatchHistoryBytes bytes (eventBytes), whichever is reached first; the events of the newest entry
// are never evicted, so even one entry larger than the bound reaches the watchers that keep up.
type watchHub struct {
	mu        sync.Mutex
	maxEvents int
	maxBytes  int64
	// maxWatchers is --max-watchers; watchers is how many are subscribed.
	maxWatchers int
	watchers    int
	segs        []*segment // oldest first; segs[0].events[head] is the oldest retained event
	head        int
	tail        int   // events in the last segment
	count       int   // retained events
	bytes       int64 // their eventBytes
	// Events are numbered by a sequence (not their index: one index has several events) that never goes
	// back, not even across reset: lo is the sequence of the oldest retained event, next of the next one
	// to be published.
	lo, next uint64
	// oldest is the smallest index a Watch may start from: events before it may be missing.
	oldest uint64
	// newest is the index of the latest entry published: its events are never evicted.
	newest uint64
	// changed is closed (and replaced) after publishes, to wake the watchers waiting for events: by the
	// notifier goroutine (notify), so that the apply loop never pays for waking many watchers. pending
	// (capacity 1) tells the notifier there is something to wake them for; publishes coalesce there.
	changed chan struct{}
	pending chan struct{}
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

// watcher is one Watch stream's subscription: where it reads next, and what it wants.
type watcher struct {
	// from is the first index the watcher wants: a node replaying its log after a restart publishes
	// events older than that, which must not reach a watcher that asked to resume later.
	from   uint64
	match  func(resource string) bool
	cursor uint64 // the sequence of the next event to look at; only the watcher's goroutine moves it
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

func newWatchHub(maxEvents int, maxBytes int64, maxWatchers int, oldest uint64) *watchHub {
	return &watchHub{maxEvents: maxEvents, maxBytes: maxBytes, maxWatchers: maxWatchers, oldest: oldest,
		changed: make(chan struct{}), pending: make(chan struct{}, 1)}
}

func matcher(resource, prefix string) func(string) bool {
	if resource != "" {
		return func(r string) bool { return r == resource }
	}
	return func(r string) bool { return strings.HasPrefix(r, prefix) }
}

// publish records the events of one applied entry for the watchers and tells the notifier. It is the
// apply loop's only work for watchers: an append, an eviction, a send that never blocks.
func (h *watchHub) publish(index uint64, events []fsm.Event) {
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
	select {
	case h.pending <- struct{}{}:
	default: // the notifier has yet to wake the watchers for an earlier publish: that wakes them for this one
	}
}

// notify wakes the watchers after publishes until stop closes (Server.Start runs it). Closing a channel
// readies every goroutine waiting on it, a cost that grows with the watchers: it is paid here, off the
// apply loop and outside the lock publish takes.
func (h *watchHub) notify(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-h.pending:
			h.wake()
		}
	}
}

func (h *watchHub) append(e fsm.Event) {
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
func (h *watchHub) evict() {
	for h.count > 0 && (h.count > h.maxEvents || h.bytes > h.maxBytes) {
		if h.head == segmentEvents { // segs[0] is evicted to its end, and a later one holds the rest
			h.segs[0] = nil
			h.segs, h.head = h.segs[1:], 0
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

// subscribe registers a watcher of the events with index >= from that match, starting with those still
// retained. from == 0 means "from now": from the index after next, the first index not yet committed when
// the watch began. It fails with a compactedError when from is older than the retained history, and with
// a limitError past --max-watchers.
func (h *watchHub) subscribe(from, next uint64, match func(string) bool) (*watcher, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, ErrStopped
	}
	if h.watchers >= h.maxWatchers {
		return nil, limited("--max-watchers", "this node serves %d watchers, the most it may", h.maxWatchers)
	}
	if from != 0 && from < h.oldest {
		return nil, &compactedError{oldest: h.oldest}
	}
	w := &watcher{from: from, match: match, cursor: h.next, epoch: h.epoch}
	if from == 0 {
		w.from = next
	} else {
		w.cursor = h.seek(from)
	}
	h.watchers++
	return w, nil
}

// seek is the sequence of the first retained event with index >= from (events are in index order, but
// for a node replaying its log, whose replayed events the watcher's from filters out).
func (h *watchHub) seek(from uint64) uint64 {
	n := sort.Search(h.count, func(i int) bool { return h.at(h.lo+uint64(i)).Index >= from })
	return h.lo + uint64(n)
}

// at is the retained event with sequence seq. Called with the lock held, or on a view (historyView.at).
func (h *watchHub) at(seq uint64) *fsm.Event {
	return historyView{segs: h.segs, head: h.head, lo: h.lo}.at(seq)
}

// historyView is the history as a reader saw it under the lock: it stays valid after the lock is
// released, since retained events never change and eviction only drops references.
type historyView struct {
	segs   []*segment
	head   int
	lo, hi uint64
}

func (v historyView) at(seq uint64) *fsm.Event {
	pos := v.head + int(seq-v.lo)
	return &v.segs[pos/segmentEvents].events[pos%segmentEvents]
}

// read returns the next events w matches, up to about maxBytes of them (at least one), and moves its
// cursor past them. With nothing new it returns no events and a channel that closes when there may be
// some. It fails when w fell behind the history, the history was reset, or the hub closed.
func (h *watchHub) read(w *watcher, maxBytes int64) ([]fsm.Event, <-chan struct{}, error) {
	v, changed, err := h.view(w)
	if err != nil || v.hi == w.cursor {
		return nil, changed, err
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
	return out, nil, nil
}

// view takes the part of the history w has yet to read, under the lock.
func (h *watchHub) view(w *watcher) (historyView, <-chan struct{}, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.closed:
		return historyView{}, nil, ErrStopped
	case w.epoch != h.epoch:
		return historyView{}, nil, errWatchReset
	case w.cursor < h.lo:
		return historyView{}, nil, errWatchFellBehind
	}
	return historyView{segs: h.segs, head: h.head, lo: h.lo, hi: h.next}, h.changed, nil
}

// len is the number of subscribed watchers (leased_watchers).
func (h *watchHub) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.watchers
}

// retained is the number and bytes of the events in the history.
func (h *watchHub) retained() (int, int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.count, h.bytes
}

func (h *watchHub) unsubscribe(w *watcher) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.watchers--
}

// reset drops the history after a snapshot restore: events before oldest are unknown to this node, and
// every watcher is cut off (it resumes, here or elsewhere, from its next index).
func (h *watchHub) reset(oldest uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.segs, h.head, h.tail, h.count, h.bytes = nil, 0, 0, 0, 0
	h.lo, h.oldest = h.next, oldest
	h.epoch++
	h.wakeLocked()
}

// closeAll ends every watcher and refuses new ones (shutdown).
func (h *watchHub) closeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.closed {
		h.closed = true
		h.wakeLocked()
	}
}

// wake wakes the watchers waiting for events: it replaces changed under the lock and closes the old one
// outside it.
func (h *watchHub) wake() {
	h.mu.Lock()
	old := h.changed
	h.changed = make(chan struct{})
	h.mu.Unlock()
	close(old)
}

// wakeLocked is wake for the rare resets and shutdown, with the lock held.
func (h *watchHub) wakeLocked() {
	close(h.changed)
	h.changed = make(chan struct{})
}

// maxClientMessage is the largest message a gRPC client accepts by default: the Watch stream's messages
// stay below it (with headroom) whatever the node's own limits, so a client with default options can read
// them.
const maxClientMessage = 4 << 20

// watchRoundBytes bounds the events one Watch round reads and sends, so that a watcher blocked sending
// to a client that stopped reading pins little memory (the rest waits in the shared history).
const watchRoundBytes = 256 << 10

// watchMessageHeadroom is room left in a Watch message for its header and framing.
const watchMessageHeadroom = 64 << 10

// watchMessageBytes is the most bytes of events one Watch message carries: the smaller of the client's
// default receive limit and the node's own request limit, less headroom.
func (c Config) watchMessageBytes() int {
	return max(min(maxClientMessage, c.Limits.MaxRequestBytes)-watchMessageHeadroom, 1)
}

// watchResponses splits events into Watch messages of at most limit bytes of events each (docs/design.md,
// "Watch"): one entry's events — an expiry batch of many leases with large values — may span several
// messages. A single event larger than limit travels alone.
func (n *node) watchResponses(events []fsm.Event, limit int) []*leasepb.WatchResponse {
	var (
		out  []*leasepb.WatchResponse
		cur  *leasepb.WatchResponse
		size int
	)
	for _, e := range events {
		pe := e.Proto()
		sz := protowire.SizeBytes(proto.Size(pe)) + 1 // the events field: tag, length, event
		if cur == nil || size+sz > limit && len(cur.Events) > 0 {
			cur, size = &leasepb.WatchResponse{Header: n.header()}, 0
			out = append(out, cur)
		}
		cur.Events = append(cur.Events, pe)
		size += sz
	}
	return out
}
