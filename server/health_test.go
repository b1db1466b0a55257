package server_test

import (
	"slices"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	"github.com/leased/leased/server/servertest"
)

// TestHealthServiceFollowsTheLeader: the standard health service answers SERVING for the node, Leases and
// Cluster while the cluster has a leader, NOT_SERVING for the node and Leases on a node left without one,
// and NotFound for a service the node does not have.
func TestHealthServiceFollowsTheLeader(t *testing.T) {
	c := servertest.Start(t, 3, nil)
	last := c.Follower()
	health := healthpb.NewHealthClient(c.Conn(last))
	check := func(service string) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		resp, err := health.Check(ctxT(t), &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			t.Fatalf("health check %q: %v", service, err)
		}
		return resp.GetStatus()
	}
	for _, svc := range []string{"", "leased.v1.Leases", "leased.v1.Cluster"} {
		svc := svc
		eventually(t, 10*time.Second, "SERVING for "+svc, func() bool { return check(svc) == healthpb.HealthCheckResponse_SERVING })
	}
	if _, err := health.Check(ctxT(t), &healthpb.HealthCheckRequest{Service: "no.such.Service"}); code(err).String() != "NotFound" {
		t.Errorf("an unknown service: %v, want NotFound", err)
	}

	for i := range c.Size() {
		if i != last {
			c.Stop(i)
		}
	}
	eventually(t, 30*time.Second, "NOT_SERVING without a leader", func() bool {
		return check("") == healthpb.HealthCheckResponse_NOT_SERVING && check("leased.v1.Leases") == healthpb.HealthCheckResponse_NOT_SERVING
	})
	if got := check("leased.v1.Cluster"); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("Cluster is %v without a leader, want SERVING (Status answers without one)", got)
	}
}

// TestReflectionListsTheServices: server reflection on the client port names every service it serves.
func TestReflectionListsTheServices(t *testing.T) {
	c := servertest.Start(t, 1, nil)
	stream, err := reflectionpb.NewServerReflectionClient(c.Conn(0)).ServerReflectionInfo(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	for _, want := range []string{"leased.v1.Leases", "leased.v1.Cluster", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"} {
		if !slices.Contains(names, want) {
			t.Errorf("reflection lists %v, without %s", names, want)
		}
	}
	// The descriptor of a service's file resolves, with its dependencies (the google.api annotations).
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: "leased.v1.Leases"}}); err != nil {
		t.Fatal(err)
	}
	if resp, err = stream.Recv(); err != nil || len(resp.GetFileDescriptorResponse().GetFileDescriptorProto()) == 0 {
		t.Fatalf("file containing leased.v1.Leases: %v %v", resp, err)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
}
