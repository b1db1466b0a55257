package client_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"net"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/client"
	"github.com/leased/leased/server/servertest"
)

func TestStatusOfEveryNodeNamesOneLeader(t *testing.T) {
	cl := servertest.Start(t, 3, nil)
	cl.WaitLeader()
	c := newClient(t, cl.Endpoints(), nil)
	ctx := ctxT(t)
	ids, leaders := map[uint64]bool{}, map[uint64]bool{}
	roles := map[leasepb.Role]int{}
	for _, ep := range c.Endpoints() {
		st, err := c.Status(ctx, ep)
		if err != nil {
			t.Fatalf("status of %s: %v", ep, err)
		}
		if st.GetId() == 0 || st.GetName() == "" || st.GetTerm() == 0 {
			t.Fatalf("status of %s: %v", ep, st)
		}
		ids[st.GetId()] = true
		leaders[st.GetLeaderId()] = true
		roles[st.GetRole()]++
	}
	if len(ids) != 3 || len(leaders) != 1 || leaders[0] || roles[leasepb.Role_ROLE_LEADER] != 1 {
		t.Fatalf("want 3 nodes agreeing on one leader: ids %v, leaders %v, roles %v", ids, leaders, roles)
	}
	for id := range leaders {
		if !ids[id] {
			t.Fatalf("leader %s is not one of the nodes %v", leasepb.FormatID(id), ids)
		}
	}
}

// An unknown member is NotFound through the SDK, against the real server.
func TestMemberRemoveOfAnUnknownMemberIsNotFound(t *testing.T) {
	cl := servertest.Start(t, 3, nil)
	c := newClient(t, cl.Endpoints(), nil)
	if _, err := c.MemberRemove(ctxT(t), 4); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("MemberRemove of an unknown member: %v, want ErrNotFound", err)
	}
}

// fakeCluster is a Cluster service whose answers a test scripts.
type fakeCluster struct {
	leasepb.UnimplementedClusterServer
	memberList func() (*leasepb.MemberListResponse, error)
	promote    func(*leasepb.MemberPromoteRequest) (*leasepb.MemberPromoteResponse, error)
	snapshot   func(grpc.ServerStreamingServer[leasepb.SnapshotChunk]) error
	calls      atomic.Int32
}

func (f *fakeCluster) MemberList(context.Context, *leasepb.MemberListRequest) (*leasepb.MemberListResponse, error) {
	f.calls.Add(1)
	return f.memberList()
}

func (f *fakeCluster) MemberPromote(_ context.Context, req *leasepb.MemberPromoteRequest) (*leasepb.MemberPromoteResponse, error) {
	f.calls.Add(1)
	return f.promote(req)
}

func (f *fakeCluster) Snapshot(_ *leasepb.SnapshotRequest, stream grpc.ServerStreamingServer[leasepb.SnapshotChunk]) error {
	f.calls.Add(1)
	return f.snapshot(stream)
}

// serveFake serves f on a loopback port until the test ends and returns its address.
func serveFake(t *testing.T, f *fakeCluster) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	leasepb.RegisterClusterServer(srv, f)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return lis.Addr().String()
}

func notLeader(hint string) error {
	st, _ := status.New(codes.Unavailable, "not the leader").WithDetails(&leasepb.LeaderHint{LeaderAddr: hint})
	return st.Err()
}

func TestClusterCallsFollowTheLeaderHint(t *testing.T) {
	leader := &fakeCluster{memberList: func() (*leasepb.MemberListResponse, error) {
		return &leasepb.MemberListResponse{Members: []*leasepb.Member{
			{Id: 1<<63 | 0xa3, Name: "n1", PeerAddr: "10.0.0.1:7201", ClientAddr: "10.0.0.1:7101"},
			{Id: 4, Name: "n4", PeerAddr: "10.0.0.4:7201", IsLearner: true},
		}}, nil
	}}
	leaderAddr := serveFake(t, leader)
	follower := &fakeCluster{memberList: func() (*leasepb.MemberListResponse, error) { return nil, notLeader(leaderAddr) }}
	c := newClient(t, []string{serveFake(t, follower)}, nil)
	ms, err := c.MemberList(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	want := []client.Member{
		{ID: 1<<63 | 0xa3, Name: "n1", PeerAddr: "10.0.0.1:7201", ClientAddr: "10.0.0.1:7101"},
		{ID: 4, Name: "n4", PeerAddr: "10.0.0.4:7201", IsLearner: true},
	}
	if len(ms) != len(want) || ms[0] != want[0] || ms[1] != want[1] {
		t.Fatalf("members %+v, want %+v", ms, want)
	}
	if follower.calls.Load() != 1 || leader.calls.Load() != 1 {
		t.Fatalf("calls: follower %d, leader %d; want one each", follower.calls.Load(), leader.calls.Load())
	}
}

func TestClusterErrorsMapToSentinels(t *testing.T) {
	for _, tc := range []struct {
		code codes.Code
		want error
	}{
		{codes.Unimplemented, client.ErrUnsupported},
		{codes.FailedPrecondition, client.ErrPrecondition},
		{codes.NotFound, client.ErrNotFound},
		{codes.InvalidArgument, client.ErrInvalid},
	} {
		f := &fakeCluster{promote: func(*leasepb.MemberPromoteRequest) (*leasepb.MemberPromoteResponse, error) {
			return nil, status.Error(tc.code, "scripted")
		}}
		c := newClient(t, []string{serveFake(t, f)}, nil)
		_, err := c.MemberPromote(ctxT(t), 4)
		if !errors.Is(err, tc.want) {
			t.Errorf("%v: want %v, got %v", tc.code, tc.want, err)
		}
		if tc.code == codes.FailedPrecondition && errors.Is(err, client.ErrHeld) {
			t.Errorf("a refused membership change is not a held resource: %v", err)
		}
	}
}

// chunks sends data in pieces, with the sha256 sum on the last.
func chunks(data []byte, sum []byte) func(grpc.ServerStreamingServer[leasepb.SnapshotChunk]) error {
	return func(stream grpc.ServerStreamingServer[leasepb.SnapshotChunk]) error {
		for off := 0; off < len(data); off += 4 {
			end := min(off+4, len(data))
			c := &leasepb.SnapshotChunk{Data: data[off:end], RemainingBytes: uint64(len(data) - end), AppliedIndex: 77}
			if end == len(data) {
				c.Sha256 = sum
			}
			if err := stream.Send(c); err != nil {
				return err
			}
		}
		return nil
	}
}

func TestSnapshotStreamsAndVerifiesTheChecksum(t *testing.T) {
	data := []byte("a consistent snapshot of the lease state")
	sum := sha256.Sum256(data)
	leaderAddr := serveFake(t, &fakeCluster{snapshot: chunks(data, sum[:])})
	follower := &fakeCluster{snapshot: func(grpc.ServerStreamingServer[leasepb.SnapshotChunk]) error { return notLeader(leaderAddr) }}
	c := newClient(t, []string{serveFake(t, follower)}, nil)
	var buf bytes.Buffer
	info, err := c.Snapshot(ctxT(t), &buf)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), data) || info.Size != int64(len(data)) || info.AppliedIndex != 77 {
		t.Fatalf("snapshot %q, info %+v", buf.Bytes(), info)
	}

	bad := newClient(t, []string{serveFake(t, &fakeCluster{snapshot: chunks(data, make([]byte, 32))})}, nil)
	if _, err := bad.Snapshot(ctxT(t), &bytes.Buffer{}); !errors.Is(err, client.ErrChecksum) {
		t.Fatalf("want ErrChecksum, got %v", err)
	}
	cut := newClient(t, []string{serveFake(t, &fakeCluster{snapshot: func(stream grpc.ServerStreamingServer[leasepb.SnapshotChunk]) error {
		return stream.Send(&leasepb.SnapshotChunk{Data: data[:8], RemainingBytes: uint64(len(data) - 8)})
	}})}, nil)
	if _, err := cut.Snapshot(ctxT(t), &bytes.Buffer{}); err == nil || errors.Is(err, client.ErrChecksum) {
		t.Fatalf("a stream that ends before its last chunk must fail as such, got %v", err)
	}
}
