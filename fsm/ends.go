package fsm

// The remembered ends of recent leases. A Release whose answer was lost (the proposer lost leadership, the
// call timed out) is retried by the client; by then its token is no longer current, because the first
// attempt ended the lease. So that the retry can answer what happened, the FSM remembers, for the last
// MaxRememberedEnds lease ends, which token of which resource ended, how (released or expired) and at which
// index. Every node applies the same entries, so every node remembers the same ends; they are carried in
// the snapshot.
//
// Memory: one end costs a 40-byte ring slot (the resource string header, token, index, kind) and its
// entry in the map by token (a uint64 key and a uint32 position), and it keeps the resource name's bytes
// alive (shared with the ended lease, not copied): BenchmarkMemoryPerEnd measures about 80 bytes per end
// plus the name, so a full ring costs about 5 MB plus names. That is a fixed ceiling, independent of the
// number of held leases. The ring grows as ends happen and is never preallocated.

// MaxRememberedEnds bounds the lease ends the FSM remembers; the oldest is forgotten first. 65,536 ends
// cover any plausible retry window (seconds) unless leases end faster than ~10,000 a second.
const MaxRememberedEnds = 65536

// EndKind says how a lease that a Release named had ended.
type EndKind uint8

const (
	// EndNone: the FSM knows the token was never a grant of that resource (or is still current).
	EndNone EndKind = iota
	// EndReleased: a Release ended it.
	EndReleased
	// EndExpired: an Expire ended it.
	EndExpired
	// EndForgotten: the token is old enough that its end, if it had one, may no longer be remembered.
	EndForgotten
)

var endKindNames = [...]string{"none", "released", "expired", "forgotten"}

// String names the kind in lowercase.
func (k EndKind) String() string {
	if int(k) < len(endKindNames) {
		return endKindNames[k]
	}
	return "unknown"
}

// End describes how a lease that is no longer current ended, as far as the FSM remembers.
type End struct {
	Resource string
	Token    uint64
	How      EndKind
	// Index is the log index of the entry that ended the lease (0 unless How is EndReleased or EndExpired).
	Index uint64
}

// leaseEnd is one remembered end, a ring slot.
type leaseEnd struct {
	resource string
	token    uint64
	index    uint64
	how      EndKind
}

// endLog is a ring of the last MaxRememberedEnds lease ends in the order they happened, with an index by
// token (tokens are unique, so a token names at most one end).
type endLog struct {
	ring    []leaseEnd // grows up to MaxRememberedEnds, then wraps
	head    int        // the oldest slot once the ring is full
	byToken map[uint64]uint32
	// forgottenThrough: every lease that ended at an index above it is remembered. It is the index of the
	// last end evicted.
	forgottenThrough uint64
}

func newEndLog() endLog { return endLog{byToken: make(map[uint64]uint32)} }

// add records an end, evicting the oldest if the ring is full.
func (e *endLog) add(resource string, token, index uint64, how EndKind) {
	rec := leaseEnd{resource: resource, token: token, index: index, how: how}
	if len(e.ring) < MaxRememberedEnds {
		e.byToken[token] = uint32(len(e.ring))
		e.ring = append(e.ring, rec)
		return
	}
	old := e.ring[e.head]
	delete(e.byToken, old.token)
	e.forgottenThrough = old.index
	e.ring[e.head] = rec
	e.byToken[token] = uint32(e.head)
	e.head = (e.head + 1) % MaxRememberedEnds
}

// of says how the lease (resource, token), known not to be current, ended; highest is the largest token
// ever granted.
func (e *endLog) of(resource string, token, highest uint64) End {
	if pos, ok := e.byToken[token]; ok {
		if rec := e.ring[pos]; rec.resource == resource {
			return End{Resource: resource, Token: token, How: rec.how, Index: rec.index}
		}
		// The token was a grant of another resource, so never of this one.
		return End{Resource: resource, Token: token, How: EndNone}
	}
	if token != 0 && token <= highest && token <= e.forgottenThrough {
		// Its end, at an index at or above the token, may have been evicted.
		return End{Resource: resource, Token: token, How: EndForgotten}
	}
	// Any end of this token would be above forgottenThrough, so remembered: it never ended, and as it is
	// not current, it was never a grant of this resource.
	return End{Resource: resource, Token: token, How: EndNone}
}

// ascend calls fn for every remembered end, oldest first.
func (e *endLog) ascend(fn func(leaseEnd)) {
	for _, rec := range e.ring[e.head:] {
		fn(rec)
	}
	for _, rec := range e.ring[:e.head] {
		fn(rec)
	}
}

func (e *endLog) len() int { return len(e.ring) }

// EndOf says how the lease (resource, token) ended; How is EndNone while the token is current.
func (f *FSM) EndOf(resource string, token uint64) End {
	if f.IsCurrent(resource, token) {
		return End{Resource: resource, Token: token, How: EndNone}
	}
	return f.ends.of(resource, token, f.highest)
}

// RememberedEnds is the number of lease ends the FSM remembers (at most MaxRememberedEnds).
func (f *FSM) RememberedEnds() int { return f.ends.len() }
