package server

import "sync"

// Per-identity bounds on what one client identity holds on a node (decision 14: with authentication, one
// identity cannot starve another). Only with client authentication: without it every client is the
// empty identity, and the node-wide limits are the only ones. Where each is enforced:
//
//	--max-leases-per-identity    the state machine, through AcquireCmd.identity_limit (fsm/identities.go),
//	                             like --max-leases-per-holder, which then counts within one identity
//	--max-watchers-per-identity  leasesService.Watch (service.go), with watchHub.identities
//	--max-waiters-per-identity   waitq.Queue.Enqueue (internal/waitq)
//	--quota-bytes-per-identity   node.admitGrant, by the leader before proposing, like --quota-bytes (quota.go)

// identityCounts counts what each identity holds; the zero value is ready to use.
type identityCounts struct {
	mu sync.Mutex
	n  map[string]int
}

// take counts one more for id unless id holds limit already; it reports whether it did.
func (c *identityCounts) take(id string, limit int) bool {
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

// put gives back one that take counted.
func (c *identityCounts) put(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[id]--; c.n[id] <= 0 {
		delete(c.n, id)
	}
}
