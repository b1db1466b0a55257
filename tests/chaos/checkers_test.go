package chaos

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/client"
)

// The checkers are plain functions over recorded data, so each can be unit-tested on a hand-made bad
// history (checkers_unit_test.go). Each returns a list of violations (empty when the invariant holds).

// ---- I1 / I2: tokens and grants, from the applied event stream and the nodes' states ----

// event is one Watch event as the harness received it.
type event struct {
	Type     client.EventType
	Index    uint64
	Resource string
	Holder   string
	Token    uint64
	Seen     time.Time // when the harness received it (after it was applied)
	Limit    int       // a semaphore slot's limit (semaphore_test.go); 0 for a plain lease
}

// releaseKey names a Release a client actually sent.
type releaseKey struct {
	Resource string
	Token    uint64
}

// checkGrants checks the applied event stream (in index order, as Watch delivers it): grant tokens are
// unique cluster-wide and equal to the entry's index; per resource they strictly increase; a resource is
// granted only while no grant is live on it (I2); a lease ends (released / expired) only if it is the live
// grant; and a RELEASED event is explained by a Release some client sent with that very token (a grant
// must never be ended by a request that named another token: sent maps each (resource, token) a client
// sent a Release for to when it first did, and that must precede the event's arrival). gaps lists indexes after which the stream
// resumed from a compacted history: per-resource state is forgotten across a gap.
func checkGrants(events []event, sent map[releaseKey]time.Time, gaps []uint64) []string {
	var v []string
	type live struct {
		token uint64
		held  bool
	}
	cur := map[string]live{}
	last := map[string]uint64{}
	seen := map[uint64]string{}
	var prevIndex uint64
	gi := 0
	for _, e := range events {
		for gi < len(gaps) && e.Index > gaps[gi] {
			cur, last = map[string]live{}, map[string]uint64{}
			gi++
		}
		if e.Index < prevIndex {
			v = append(v, fmt.Sprintf("event index %d after %d: stream out of order", e.Index, prevIndex))
		}
		prevIndex = e.Index
		switch e.Type {
		case client.Granted:
			if e.Token != e.Index {
				v = append(v, fmt.Sprintf("I1: grant of %s at index %d carries token %d", e.Resource, e.Index, e.Token))
			}
			if r, dup := seen[e.Token]; dup {
				v = append(v, fmt.Sprintf("I1: token %d granted twice (%s and %s)", e.Token, r, e.Resource))
			}
			seen[e.Token] = e.Resource
			if e.Token <= last[e.Resource] {
				v = append(v, fmt.Sprintf("I1: %s granted token %d after token %d", e.Resource, e.Token, last[e.Resource]))
			}
			last[e.Resource] = max(last[e.Resource], e.Token)
			if l := cur[e.Resource]; l.held {
				v = append(v, fmt.Sprintf("I2: %s granted token %d while token %d was live", e.Resource, e.Token, l.token))
			}
			cur[e.Resource] = live{token: e.Token, held: true}
		case client.Released, client.Expired:
			l, ok := cur[e.Resource]
			if ok && (!l.held || l.token != e.Token) {
				v = append(v, fmt.Sprintf("I2: %v of %s token %d at index %d, but the live grant is %+v", e.Type, e.Resource, e.Token, e.Index, l))
			}
			cur[e.Resource] = live{}
			if e.Type == client.Released && sent != nil {
				if at, ok := sent[releaseKey{e.Resource, e.Token}]; !ok || !at.Before(e.Seen) {
					v = append(v, fmt.Sprintf("I2: %s token %d released at index %d, but no client had sent a release of that token", e.Resource, e.Token, e.Index))
				}
			}
		}
	}
	return v
}

// checkStates checks that every node's applied state at the same index is identical (identities too, which
// a restore shares between a holder's leases), that each holds at most one grant per resource, that no
// token appears twice, and that each state agrees with the grants the event stream left live (replayed up
// to that index), when the stream is complete.
func checkStates(states []nodeState, events []event, complete bool) []string {
	var v []string
	key := func(l *leasepb.Lease) string {
		return fmt.Sprintf("%s|%s|%d|%d|%x|%s", l.GetResource(), l.GetHolder(), l.GetToken(), l.GetTtlMs(), l.GetValue(), l.GetIdentity())
	}
	for i, st := range states {
		res := map[string]bool{}
		tok := map[uint64]bool{}
		for _, l := range st.leases {
			if res[l.GetResource()] {
				v = append(v, fmt.Sprintf("I2: node %d holds two grants on %s", i+1, l.GetResource()))
			}
			if tok[l.GetToken()] {
				v = append(v, fmt.Sprintf("I1: node %d has token %d twice", i+1, l.GetToken()))
			}
			res[l.GetResource()], tok[l.GetToken()] = true, true
		}
		if i == 0 {
			continue
		}
		if st.applied != states[0].applied {
			v = append(v, fmt.Sprintf("node %d at index %d, node 1 at %d: not comparable", i+1, st.applied, states[0].applied))
			continue
		}
		a, b := states[0].leases, st.leases
		if len(a) != len(b) {
			v = append(v, fmt.Sprintf("I2: at index %d node 1 has %d leases, node %d has %d", st.applied, len(a), i+1, len(b)))
			continue
		}
		for k := range a {
			if key(a[k]) != key(b[k]) {
				v = append(v, fmt.Sprintf("I2: at index %d node 1 has %s, node %d has %s", st.applied, key(a[k]), i+1, key(b[k])))
			}
		}
	}
	if complete && len(states) > 0 {
		liveTok := map[string]uint64{}
		for _, e := range events {
			if e.Index > states[0].applied {
				break
			}
			if e.Type == client.Granted {
				liveTok[e.Resource] = e.Token
			} else {
				delete(liveTok, e.Resource)
			}
		}
		got := map[string]uint64{}
		for _, l := range states[0].leases {
			got[l.GetResource()] = l.GetToken()
		}
		for r, t := range liveTok {
			if got[r] != t {
				v = append(v, fmt.Sprintf("I2: events leave %s/%d live at index %d, the state has token %d", r, t, states[0].applied, got[r]))
			}
		}
		for r, t := range got {
			if _, ok := liveTok[r]; !ok {
				v = append(v, fmt.Sprintf("I2: the state holds %s/%d that the events do not", r, t))
			}
		}
	}
	return v
}

// ---- I3: acknowledged operations survive a full restart ----

// durableRecord is what the harness knows about one long-TTL lease: acquired (acknowledged, token), and
// whether a release was acknowledged.
type durableRecord struct {
	Resource string
	Token    uint64
	Released bool // release acknowledged
	Unsure   bool // a release was attempted but its outcome is unknown
}

// checkDurable compares acknowledged long-TTL grants and releases with what the cluster reports after
// the restart (resource -> token of the current grant; absent when free).
func checkDurable(recs []durableRecord, after map[string]uint64) []string {
	var v []string
	for _, r := range recs {
		switch {
		case r.Unsure:
		case r.Released:
			if after[r.Resource] == r.Token {
				v = append(v, fmt.Sprintf("I3: release of %s/%d was acknowledged but the grant is back", r.Resource, r.Token))
			}
		default:
			if after[r.Resource] != r.Token {
				v = append(v, fmt.Sprintf("I3: grant %s/%d was acknowledged (TTL not over) but the cluster has token %d", r.Resource, r.Token, after[r.Resource]))
			}
		}
	}
	return v
}

// ---- I4: no two SDK holders believe they hold the same resource at once ----

// belief is one SDK lease as its holder saw it. Acquired is when Acquire returned (after the grant);
// LastValid is the latest instant at which the holder checked and found the lease valid (taken *before*
// the check, so the lease was certainly believed valid after it); DoneSeen is when the holder saw Done
// close (after it did).
type belief struct {
	Resource  string
	Token     uint64
	Holder    string
	Acquired  time.Time
	LastValid time.Time
	DoneSeen  time.Time
	EndReason string // why Done closed (endReason): released, lost-contact, expired, closed
}

// checkBeliefs counts pairs where a holder provably still believed in its lease after a later grant on
// the same resource had been acknowledged to another holder (strict: no measurement slack can produce a
// false positive). It also reports the loose figure (Done seen after the later Acquire returned), which
// includes goroutine scheduling delay and is informational.
func checkBeliefs(bs []belief) (violations []string, loose int) {
	by := map[string][]belief{}
	for _, b := range bs {
		by[b.Resource] = append(by[b.Resource], b)
	}
	for _, list := range by {
		slices.SortFunc(list, func(a, b belief) int { return cmp.Compare(a.Token, b.Token) })
		for i, a := range list {
			for _, b := range list[i+1:] {
				if b.Token == a.Token {
					continue
				}
				if !a.LastValid.IsZero() && a.LastValid.After(b.Acquired) {
					violations = append(violations, fmt.Sprintf("I4: %s: %s still trusted token %d %v after %s was granted token %d",
						a.Resource, a.Holder, a.Token, a.LastValid.Sub(b.Acquired), b.Holder, b.Token))
				}
				if !a.DoneSeen.IsZero() && a.DoneSeen.After(b.Acquired) {
					loose++
				}
			}
		}
	}
	return violations, loose
}

// ---- I5: the fenced store ----

// write is one write a store accepted, in the order the store committed them.
type write struct {
	Resource string
	Token    uint64
	Value    string
}

// fenceReport is what the I5 checker finds in a store's accepted writes.
type fenceReport struct {
	Accepted      int
	StaleAccepted int // writes accepted with a token lower than one accepted before for the resource
	LostUpdates   int // resources whose final value was not written by their highest-token writer
}

func checkFence(log []write, final map[string]string) (fenceReport, []string) {
	var r fenceReport
	var v []string
	highest := map[string]uint64{}
	lastOfHighest := map[string]string{}
	for _, w := range log {
		r.Accepted++
		if w.Token < highest[w.Resource] {
			r.StaleAccepted++
			v = append(v, fmt.Sprintf("I5: %s accepted token %d after token %d", w.Resource, w.Token, highest[w.Resource]))
			continue
		}
		highest[w.Resource] = w.Token
		lastOfHighest[w.Resource] = w.Value
	}
	var res []string
	for k := range highest {
		res = append(res, k)
	}
	slices.Sort(res)
	for _, k := range res {
		if final[k] != lastOfHighest[k] {
			r.LostUpdates++
			v = append(v, fmt.Sprintf("I5: final value of %s is %q, written last by the highest token: %q", k, final[k], lastOfHighest[k]))
		}
	}
	return r, v
}
