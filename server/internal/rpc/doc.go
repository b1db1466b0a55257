// Package rpc is a node's request path: the gRPC Leases, Cluster and health services of the client port,
// the HTTP/JSON gateway over the Leases service, the Writes stream and its batches, and the peer port's
// Forward. Every write goes through one path (forward.go: validated at the edge, run here if this node
// leads, else forwarded to the leader once); the limits on what clients hold are checked here, before
// anything is proposed, and ToStatus alone maps the node's errors to gRPC statuses.
//
// It knows the node only through LeaseHost (raft, the state machine and the member table) and the parts
// package server hands New, and registers its own metrics (NewMetrics). It never imports package server.
package rpc
