package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/client"
)

// ---- counting semaphores: a workload of slot holders, and the "at most N" checker ----
//
// Semaphore workers take slots of a few semaphore resources (sem/...) under the same faults as the rest
// of the workload. Their events (those whose lease carries a limit) are kept apart from the plain-lease
// stream (run.semEvents), and their slots apart from the plain leases of each node's state
// (nodeState.slots): the plain checkers (I1/I2, porcupine, the answer log) assume one grant per resource,
// which a semaphore legitimately breaks. checkSemaphores holds them to the semaphore's own I1/I2.

const (
	semLimit     = 2 // slots per semaphore resource
	semResources = 2 // sem/0, sem/1
)

// semaphoreWorker takes a slot (waiting FIFO, bounded by acquireTimeout), holds it briefly, and
// releases it, until ctx ends or OpsPerWorker ops are done.
func (r *run) semaphoreWorker(ctx context.Context, k int) {
	defer r.wg.Done()
	holder := fmt.Sprintf("sem%d", k)
	cl := r.newClient(holder, nil)
	defer cl.Close()
	rng := rand.New(rand.NewPCG(r.cfg.Seed, uint64(7000+k)))
	for op := 0; op < r.cfg.OpsPerWorker && ctx.Err() == nil; op++ {
		res := fmt.Sprintf("sem/%d", rng.IntN(semResources))
		actx, cancel := context.WithTimeout(ctx, acquireTimeout)
		l, err := cl.Acquire(actx, res, client.WithLimit(semLimit), client.WithWait(), client.WithTTL(leaseTTL))
		cancel()
		r.stats.named("semaphore-acquire", classify(err))
		if err != nil {
			sleepCtx(ctx, time.Duration(20+rng.IntN(80))*time.Millisecond) // retry pace
			continue
		}
		sleepCtx(ctx, time.Duration(50+rng.IntN(300))*time.Millisecond) // the holder's work
		rctx, cancel := context.WithTimeout(context.Background(), readTimeout)
		r.stats.named("semaphore-release", classify(l.Release(rctx)))
		cancel()
	}
}

// checkSemaphores checks the semaphore event stream (index order): every grant's token is its entry's
// index, unique and larger than every earlier slot token of its resource; all live slots of a resource
// share one limit; at no index are more than that many live (I2 for semaphores); a slot ends only while
// live. gaps as for checkGrants.
func checkSemaphores(events []event, gaps []uint64) []string {
	var v []string
	live := map[string]map[uint64]bool{}
	limit := map[string]int{}
	last := map[string]uint64{}
	seen := map[uint64]bool{}
	gi := 0
	for _, e := range events {
		for gi < len(gaps) && e.Index > gaps[gi] {
			live, last = map[string]map[uint64]bool{}, map[string]uint64{}
			gi++
		}
		switch e.Type {
		case client.Granted:
			if e.Token != e.Index || seen[e.Token] || e.Token <= last[e.Resource] {
				v = append(v, fmt.Sprintf("sem: %s slot token %d at index %d is not a fresh, increasing token (last %d)", e.Resource, e.Token, e.Index, last[e.Resource]))
			}
			seen[e.Token], last[e.Resource] = true, max(last[e.Resource], e.Token)
			if len(live[e.Resource]) == 0 {
				live[e.Resource], limit[e.Resource] = map[uint64]bool{}, e.Limit
			}
			if e.Limit != limit[e.Resource] {
				v = append(v, fmt.Sprintf("sem: %s slot %d has limit %d while its live slots have %d", e.Resource, e.Token, e.Limit, limit[e.Resource]))
			}
			live[e.Resource][e.Token] = true
			if n := len(live[e.Resource]); n > limit[e.Resource] {
				v = append(v, fmt.Sprintf("sem: %s has %d live slots at index %d, limit %d", e.Resource, n, e.Index, limit[e.Resource]))
			}
		case client.Released, client.Expired:
			if slots, ok := live[e.Resource]; ok && !slots[e.Token] {
				v = append(v, fmt.Sprintf("sem: %v of %s slot %d at index %d, which is not live", e.Type, e.Resource, e.Token, e.Index))
			}
			delete(live[e.Resource], e.Token)
		}
	}
	return v
}

// checkSemaphoreStates: in every node's state, at most limit slots per semaphore resource, and the same
// slots on every node at the same applied index.
func checkSemaphoreStates(states []nodeState) []string {
	var v []string
	key := func(l *leasepb.Lease) string {
		return fmt.Sprintf("%s|%d|%d|%s", l.GetResource(), l.GetToken(), l.GetLimit(), l.GetHolder())
	}
	for i, st := range states {
		count := map[string]int{}
		for _, l := range st.slots {
			if count[l.GetResource()]++; count[l.GetResource()] > int(l.GetLimit()) {
				v = append(v, fmt.Sprintf("sem: node %d holds %d slots of %s, limit %d", i+1, count[l.GetResource()], l.GetResource(), l.GetLimit()))
			}
		}
		if i == 0 || st.applied != states[0].applied {
			continue
		}
		a, b := states[0].slots, st.slots
		if len(a) != len(b) {
			v = append(v, fmt.Sprintf("sem: at index %d node 1 has %d slots, node %d has %d", st.applied, len(a), i+1, len(b)))
			continue
		}
		for k := range a {
			if key(a[k]) != key(b[k]) {
				v = append(v, fmt.Sprintf("sem: at index %d node 1 has %s, node %d has %s", st.applied, key(a[k]), i+1, key(b[k])))
			}
		}
	}
	return v
}
