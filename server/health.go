package server

import (
	"fmt"
	"time"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/leased/leased/api/leasepb"
)

// The standard gRPC health service (grpc.health.v1.Health) on the client port, for load balancers and
// orchestrators that speak it (grpc_health_probe, Kubernetes' grpc probes). The overall status ("") and
// leased.v1.Leases are SERVING while the node is ready (Ready: it knows a leader and its raft loop runs)
// — the rule of the admin port's /readyz — and NOT_SERVING otherwise, after a fatal error, and from the
// start of shutdown. leased.v1.Cluster is SERVING while the node runs: Status answers without a leader.
//
// Nothing here waits for the raft loop or the disk: every input is an atomic the loop and the writers
// keep up to date, so a stalled node says so instead of hanging the probe that asks.

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

// healthServices are the services whose status follows the leader.
var healthServices = []string{"", leasepb.Leases_ServiceDesc.ServiceName}

// watchHealth keeps the health statuses in step with the node, looking every tick, until stop.
func (s *Server) watchHealth(stop <-chan struct{}) {
	s.health.SetServingStatus(leasepb.Cluster_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	ticker := time.NewTicker(s.cfg.TickInterval)
	defer ticker.Stop()
	last := healthpb.HealthCheckResponse_UNKNOWN
	for {
		want := healthpb.HealthCheckResponse_NOT_SERVING
		if s.Ready() == nil {
			want = healthpb.HealthCheckResponse_SERVING
		}
		select {
		case <-s.node.raft.Done(): // stopped serving: a fatal error
			s.health.Shutdown()
			return
		default:
		}
		if want != last { // Set notifies every Watch stream, so only on a change
			for _, svc := range healthServices {
				s.health.SetServingStatus(svc, want)
			}
			last = want
		}
		select {
		case <-stop:
			return
		case <-s.node.raft.Done():
		case <-ticker.C:
		}
	}
}

// newHealth is the health service with every status NOT_SERVING until watchHealth decides.
func newHealth() *health.Server {
	h := health.NewServer()
	for _, svc := range append(healthServices, leasepb.Cluster_ServiceDesc.ServiceName) {
		h.SetServingStatus(svc, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	return h
}
