package rpc

import (
	"time"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/leased/leased/api/leasepb"
)

// The standard gRPC health service (grpc.health.v1.Health) on the client port. The overall status ("")
// and leased.v1.Leases follow the server's Ready (its rule is documented there: server/health.go);
// leased.v1.Cluster is SERVING while the node runs: Status answers without a leader.

// healthServices are the services whose status follows the leader.
var healthServices = []string{"", leasepb.Leases_ServiceDesc.ServiceName}

// FollowHealth keeps h's statuses in step with ready (the server's Ready), looking every tick, until stop;
// when the node stops serving (done: a fatal error) it shuts h down.
func FollowHealth(h *health.Server, ready func() error, tick time.Duration, done, stop <-chan struct{}) {
	h.SetServingStatus(leasepb.Cluster_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	ticker := time.NewTicker(tick)
	defer ticker.Stop()
	last := healthpb.HealthCheckResponse_UNKNOWN
	for {
		want := healthpb.HealthCheckResponse_NOT_SERVING
		if ready() == nil {
			want = healthpb.HealthCheckResponse_SERVING
		}
		select {
		case <-done: // stopped serving: a fatal error
			h.Shutdown()
			return
		default:
		}
		if want != last { // Set notifies every Watch stream, so only on a change
			for _, svc := range healthServices {
				h.SetServingStatus(svc, want)
			}
			last = want
		}
		select {
		case <-stop:
			return
		case <-done:
		case <-ticker.C:
		}
	}
}

// NewHealth is the health service with every status NOT_SERVING until FollowHealth decides.
func NewHealth() *health.Server {
	h := health.NewServer()
	for _, svc := range append(healthServices, leasepb.Cluster_ServiceDesc.ServiceName) {
		h.SetServingStatus(svc, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	return h
}
