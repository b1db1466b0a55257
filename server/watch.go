package server

import (
	"strings"
	"sync"

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

// watchResponse is one message of a Watch stream.
func (n *node) watchResponse(events []fsm.Event) *leasepb.WatchResponse {
	resp := &leasepb.WatchResponse{Header: n.header(), Events: make([]*leasepb.Event, len(events))}
	for i, e := range events {
		resp.Events[i] = e.Proto()
	}
	return resp
}
