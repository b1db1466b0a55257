package server

import (
	"time"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/leased/leased/api/leasepb"
)

// The standard gRPC health service (grpc.health.v1.Health) on the client port, for load balancers and
// orchestrators that speak it (grpc_health_probe, Kubernetes' grpc probes). The overall status ("") and
// leased.v1.Leases are SERVING while the node knows a leader — the rule of the admin port's /readyz —
// and NOT_SERVING without one, after a fatal error, and from the start of shutdown. leased.v1.Cluster is
// SERVING while the node runs: Status answers without a leader.

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
		if s.node.knownLeader() != 0 {
			want = healthpb.HealthCheckResponse_SERVING
		}
		select {
		case <-s.node.done: // stopped serving: a fatal error
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
		case <-s.node.done:
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
