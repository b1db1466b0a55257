package server

import (
	"fmt"
	"time"
)

// The standard gRPC health service (grpc.health.v1.Health) on the client port, for load balancers and
// orchestrators that speak it (grpc_health_probe, Kubernetes' grpc probes). The overall status ("") and
// leased.v1.Leases are SERVING while the node is ready (Ready: it knows a leader and its raft loop runs)
// — the rule of the admin port's /readyz — and NOT_SERVING otherwise, after a fatal error, and from the
// start of shutdown. leased.v1.Cluster is SERVING while the node runs: Status answers without a leader.
//
// Nothing here waits for the raft loop or the disk: every input is an atomic the loop and the writers
// keep up to date, so a stalled node says so instead of hanging the probe that asks. The service itself is
// internal/rpc's (health.go); Ready is its rule.

// Ready reports whether this node can serve requests: nil while it knows a leader and its raft loop runs.
// Otherwise the error says why — it stopped (ErrStopped, with the fatal error), its loop has not run for an
// election timeout (ErrLoopStalled, naming the raft log write in flight, if any), or it knows no leader
// (ErrNoLeader). A stalled follower still knows the leader, but it can neither apply nor answer a read
// until its loop runs. Ready never blocks.
func (s *Server) Ready() error { return readiness(s.node) }

// readiness is Ready's rule, for the server and its metrics.
func readiness(n *node) error {
	select {
	case <-n.raft.Done():
		if err := n.raft.Err(); err != nil {
			return fmt.Errorf("%w: %v", ErrStopped, err)
		}
		return ErrStopped
	default:
	}
	if stalled := n.raft.LoopStalled(); stalled > 0 {
		if op, age, ok := n.raft.Watchdog().InFlight(); ok {
			return fmt.Errorf("%w for %v: raft log %s in flight for %v", ErrLoopStalled,
				stalled.Round(time.Millisecond), op, age.Round(time.Millisecond))
		}
		return fmt.Errorf("%w for %v", ErrLoopStalled, stalled.Round(time.Millisecond))
	}
	if n.raft.KnownLeader() == 0 {
		return ErrNoLeader
	}
	return nil
}
