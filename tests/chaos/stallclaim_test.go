package chaos

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// The stalled-leader checker ("stall"): a leader whose Ready loop is blocked in a disk write must stop
// naming itself the leader once its peers have moved on (docs/design.md, "A stalled leader does not
// claim to lead"). While it still did, clients' leader discovery kept choosing it — it answers Status
// off its loop, faster than the busy new leader — until their leases ran out (seed 1414, an L1 loss).
// During each disk-stall-leader fault the harness asks every node's Status every 50 ms; once another
// node has been seen leading in a later term for two election timeouts, an answer of the stalled node
// naming itself the leader is a violation. Two election timeouts: a node whose loop runs learns of the
// later term (or steps down by check-quorum) within one; only a node that cannot act still claims.

// statusObs is one Status answer seen during a disk stall: the node asked, when (since the history
// began, when the question was sent), the term it answered with, and whether it named itself the leader.
type statusObs struct {
	Node  int
	At    time.Duration
	Term  uint64
	Leads bool
}

// watchStallClaims asks every node's Status every 50 ms until ctx ends, and returns what they said.
func (r *run) watchStallClaims(ctx context.Context) []statusObs {
	var (
		mu  sync.Mutex
		obs []statusObs
	)
	tk := time.NewTicker(50 * time.Millisecond)
	defer tk.Stop()
	for {
		var wg sync.WaitGroup
		for i := range r.c.Nodes {
			wg.Go(func() {
				at := time.Duration(r.hist.now())
				s, err := r.c.Status(ctx, i)
				if err != nil {
					return
				}
				mu.Lock()
				obs = append(obs, statusObs{Node: i, At: at, Term: s.GetTerm(), Leads: s.GetLeaderId() != 0 && s.GetLeaderId() == s.GetId()})
				mu.Unlock()
			})
		}
		wg.Wait()
		select {
		case <-ctx.Done():
			return obs
		case <-tk.C:
		}
	}
}

// checkStallClaims reports, in one finding a stall, the answers of node stalled naming itself the leader
// at least grace after another node was seen leading in a later term: the first, and how many.
func checkStallClaims(stalled int, obs []statusObs, grace time.Duration) []string {
	var first, newer statusObs
	claims := 0
	for _, o := range obs {
		if o.Node != stalled || !o.Leads {
			continue
		}
		i := slices.IndexFunc(obs, func(p statusObs) bool {
			return p.Node != stalled && p.Leads && p.Term > o.Term && p.At+grace <= o.At
		})
		if i < 0 {
			continue
		}
		if claims == 0 {
			first, newer = o, obs[i]
		}
		claims++
	}
	if claims == 0 {
		return nil
	}
	return []string{fmt.Sprintf("stall: n%d, its disk stalled, named itself the leader (term %d) at %v, %v after n%d was seen leading in term %d (%d such answers in this stall)",
		stalled+1, first.Term, first.At.Round(time.Millisecond), (first.At - newer.At).Round(time.Millisecond), newer.Node+1, newer.Term, claims)}
}
