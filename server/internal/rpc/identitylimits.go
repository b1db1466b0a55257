package rpc

// Per-identity bounds on what one client identity holds on a node (decision 14: with authentication, one
// identity cannot starve another). Only with client authentication: without it every client is the
// empty identity, and the node-wide limits are the only ones. Where each is enforced:
//
//	--max-leases-per-identity    the state machine, through AcquireCmd.identity_limit (fsm/identities.go),
//	                             like --max-leases-per-holder, which then counts within one identity
//	--max-watchers-per-identity  leasesService.Watch (service.go), with watch.Hub.Identities
//	--max-waiters-per-identity   waitq.Queue.Enqueue (internal/waitq)
//	--quota-bytes-per-identity   leases.State.AdmitGrant, by the leader before proposing, like --quota-bytes (internal/leases)
