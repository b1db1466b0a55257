package server_test

import (
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/server/servertest"
	"github.com/leased/leased/server/servertest/testcerts"
)

// TestRejoinIsRefusedForAnotherCertificateOrARunningMember: a rejoin retires a member's raft id, so over
// peer TLS it must come with that member's own certificate, and it is refused while the member still
// runs (the leader hears from it). Neither refusal changes the member table.
func TestRejoinIsRefusedForAnotherCertificateOrARunningMember(t *testing.T) {
	ca := testcerts.NewCA(t, "ca")
	c := servertest.StartTLS(t, 3, ca, nil)
	ctx := ctxT(t)
	before := members(t, c, c.WaitLeader())
	join := func(as string) error {
		conn, err := grpc.NewClient(c.Config(0).PeerAddr,
			grpc.WithTransportCredentials(credentials.NewTLS(testcerts.MutualConfig(ca.Node(t, as), ca))))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_, err = wirepb.NewRaftClient(conn).Join(ctx, &wirepb.JoinRequest{Name: "n3", Rejoin: true, PeerAddr: c.Config(2).PeerAddr})
		return err
	}
	if err := join("n2"); status.Code(err) != codes.PermissionDenied {
		t.Errorf("rejoin of n3 with n2's certificate: %v, want PermissionDenied", err)
	}
	if err := join("n3"); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("rejoin of n3, which runs: %v, want FailedPrecondition", err)
	}
	after := members(t, c, c.WaitLeader())
	if len(after) != len(before) {
		t.Fatalf("members %v -> %v", before, after)
	}
	for i := range before {
		before[i].IsLeader, after[i].IsLeader = false, false
		if !proto.Equal(before[i], after[i]) {
			t.Errorf("member %v became %v", before[i], after[i])
		}
	}
}
