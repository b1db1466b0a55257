package server

import (
	"strings"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/fsm"
)

// watchHub keeps a bounded history of events, in index order, and fans new events out to watchers. A
// watcher that cannot keep up is cut off (its channel closed with overflow set) rather than slowing the
// apply loop; it resumes from the index after the last event it saw.
type watchHub struct {
	mu       sync.Mutex
	capacity int
	history  []fsm.Event // ring buffer
	start    int         // position of the oldest event in history
	// oldest is the smallest index a Watch may start from: events before it may be missing.
	oldest   uint64
	watchers map[*watcher]struct{}
}

// watcher is one Watch stream's subscription.
type watcher struct {
	// from is the first index the watcher wants: a node replaying its log after a restart publishes
	// events older than that, which must not reach a watcher that asked to resume later.
	from     uint64
	match    func(resource string) bool
	ch       chan []fsm.Event
	overflow bool // set under the hub's lock before ch is closed
}

const watcherBuffer = 1024

func newWatchHub(capacity int, oldest uint64) *watchHub {
	return &watchHub{capacity: capacity, oldest: oldest, watchers: make(map[*watcher]struct{})}
}

func matcher(resource, prefix string) func(string) bool {
	if resource != "" {
		return func(r string) bool { return r == resource }
	}
	return func(r string) bool { return strings.HasPrefix(r, prefix) }
}

// publish records the events of one applied entry and delivers them.
func (h *watchHub) publish(index uint64, events []fsm.Event) {
	if len(events) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, e := range events {
		h.append(e)
	}
	for w := range h.watchers {
		if batch := filterEvents(events, w.match, w.from); len(batch) > 0 {
			select {
			case w.ch <- batch:
			default:
				w.overflow = true
				close(w.ch)
				delete(h.watchers, w)
			}
		}
	}
}

func (h *watchHub) append(e fsm.Event) {
	if len(h.history) < h.capacity {
		h.history = append(h.history, e)
		return
	}
	evicted := h.history[h.start]
	h.history[h.start] = e
	h.start = (h.start + 1) % h.capacity
	h.oldest = max(h.oldest, evicted.Index+1)
}

// subscribe registers a watcher and returns the retained events with index >= from that it matches.
// from == 0 means "from now": from the index after next, the first index not yet committed when the
// watch began. It fails with a compactedError when from is older than the retained history.
func (h *watchHub) subscribe(from, next uint64, match func(string) bool) (*watcher, []fsm.Event, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if from != 0 && from < h.oldest {
		return nil, nil, &compactedError{oldest: h.oldest}
	}
	var backlog []fsm.Event
	if from != 0 {
		for i := range h.history {
			backlog = append(backlog, filterEvents(h.history[(h.start+i)%len(h.history):][:1], match, from)...)
		}
	}
	start := from
	if start == 0 {
		start = next
	}
	w := &watcher{from: start, match: match, ch: make(chan []fsm.Event, watcherBuffer)}
	h.watchers[w] = struct{}{}
	return w, backlog, nil
}

// len is the number of subscribed watchers (leased_watchers).
func (h *watchHub) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.watchers)
}

func (h *watchHub) unsubscribe(w *watcher) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.watchers[w]; ok {
		delete(h.watchers, w)
		close(w.ch)
	}
}

// reset drops the history after a snapshot restore: events before oldest are unknown to this node.
func (h *watchHub) reset(oldest uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.history, h.start, h.oldest = nil, 0, oldest
	for w := range h.watchers {
		w.overflow = true
		close(w.ch)
		delete(h.watchers, w)
	}
}

// closeAll ends every watcher (shutdown).
func (h *watchHub) closeAll() { h.reset(h.oldest) }

func filterEvents(events []fsm.Event, match func(string) bool, from uint64) []fsm.Event {
	var out []fsm.Event
	for _, e := range events {
		if e.Index >= from && match(e.Lease.Resource) {
			out = append(out, e)
		}
	}
	return out
}

// maxClientMessage is the largest message a gRPC client accepts by default: the Watch stream's messages
// stay below it (with headroom) whatever the node's own limits, so a client with default options can read
// them.
const maxClientMessage = 4 << 20

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
