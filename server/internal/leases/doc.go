// Package leases owns the node's state machine (fsm.FSM). The Ready loop hands it the committed entries
// (State.Apply), and it tells whoever cares what each one changed: the lessor, the watchers, the blocking
// acquires, the proposers, the metrics and the audit trail, each through a hook the node sets when it
// builds the State. It counts the state's size against --quota-bytes and --max-leases, which the leader
// checks before proposing a grant (AdmitGrant), and lets the rest of the node read the state under one
// lock (Read). It imports only api, fsm and errs of ours, never package server.
package leases
