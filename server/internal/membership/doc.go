// Package membership is a node's side of the member table that the state machine keeps (decision 11):
// the conf changes the leader makes (add, promote, remove, a member's client address), automatic
// promotion of caught-up learners, the peer port's Join (new members, wiped members rejoining, removal
// checks), the transport's peers and the peer-certificate names that follow the table, and gossip for
// discovery. It knows the rest of the node only through Host, and returns the errors of
// server/internal/errs, which package server maps to statuses.
package membership
