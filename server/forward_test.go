package server_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest"
)

// TestForwardedWriteRunsOnTheLeaderOnly: a write forwarded to the leader runs there; one forwarded to a
// follower is never forwarded again, it is answered Unavailable with the leader hint.
func TestForwardedWriteRunsOnTheLeaderOnly(t *testing.T) {
	c := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	li, fi := c.WaitLeader(), c.Follower()
	acq := func(i int, resource string) (*wirepb.ForwardResponse, error) {
		conn, err := grpc.NewClient(c.Node(i).PeerAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		vt, err := c.Leases(li).ValidateToken(ctx, &leasepb.ValidateTokenRequest{Resource: "x", Token: 1})
		if err != nil {
			t.Fatal(err)
		}
		return wirepb.NewRaftClient(conn).Forward(ctx, &wirepb.ForwardRequest{
			ClusterId: vt.GetHeader().GetClusterId(), From: c.Node(fi).ID(),
			Request: &wirepb.ForwardRequest_Acquire{Acquire: &leasepb.AcquireRequest{Resource: resource, Holder: "h", TtlMs: 5000}},
		})
	}
	resp, err := acq(li, "on-leader")
	if err != nil {
		t.Fatalf("forwarded to the leader: %v", err)
	}
	if h := resp.GetAcquire().GetHeader(); h.GetMemberId() != c.Node(li).ID() || h.GetLeaderId() != c.Node(li).ID() {
		t.Fatalf("header %+v, want the leader's", h)
	}
	_, err = acq(fi, "on-follower")
	if code(err) != codes.Unavailable {
		t.Fatalf("forwarded to a follower: %v, want Unavailable", err)
	}
	var hint *leasepb.LeaderHint
	for _, d := range status.Convert(err).Details() {
		if h, ok := d.(*leasepb.LeaderHint); ok {
			hint = h
		}
	}
	if hint.GetLeaderId() != c.Node(li).ID() {
		t.Fatalf("leader hint %+v, want leader %x", hint, c.Node(li).ID())
	}
	if _, err := c.Leases(li).Get(ctx, &leasepb.GetRequest{Resource: "on-follower"}); code(err) != codes.NotFound {
		t.Fatalf("the write forwarded to a follower ran: %v", err)
	}
}

// TestForwardedWritesAreValidatedOnTheLeader calls the leader's peer-port Forward RPC, as a follower
// would, with requests a client-facing handler refuses: the leader refuses them too, with
// InvalidArgument, and proposes nothing.
func TestForwardedWritesAreValidatedOnTheLeader(t *testing.T) {
	c := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	li := c.WaitLeader()
	leader := c.Node(li)
	vt, err := c.Leases(li).ValidateToken(ctx, &leasepb.ValidateTokenRequest{Resource: "x", Token: 1})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(leader.PeerAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	peer := wirepb.NewRaftClient(conn)

	tooMany := make([]*leasepb.LeaseRef, c.Config(li).Limits.MaxKeepAliveLeases+1)
	for i := range tooMany {
		tooMany[i] = &leasepb.LeaseRef{Resource: fmt.Sprintf("r%d", i), Token: uint64(i + 1)}
	}
	for name, fwd := range map[string]*wirepb.ForwardRequest{
		"acquire without holder": {Request: &wirepb.ForwardRequest_Acquire{Acquire: &leasepb.AcquireRequest{Resource: "r", TtlMs: 5000}}},
		"release of nothing":     {Request: &wirepb.ForwardRequest_Release{Release: &leasepb.ReleaseRequest{}}},
		"release with token 0":   {Request: &wirepb.ForwardRequest_Release{Release: &leasepb.ReleaseRequest{Resource: "r"}}},
		"renew of a bad name":    {Request: &wirepb.ForwardRequest_Renew{Renew: &leasepb.RenewRequest{Resource: "a//b", Token: 1}}},
		"keepalive over limit":   {Request: &wirepb.ForwardRequest_KeepAlive{KeepAlive: &leasepb.KeepAliveRequest{Leases: tooMany}}},
		"keepalive bad ref":      {Request: &wirepb.ForwardRequest_KeepAlive{KeepAlive: &leasepb.KeepAliveRequest{Leases: []*leasepb.LeaseRef{{Resource: "r"}}}}},
		"no request":             {},
	} {
		t.Run(name, func(t *testing.T) {
			before := leader.AppliedIndex()
			fwd.ClusterId, fwd.From = vt.GetHeader().GetClusterId(), c.Node(c.Follower()).ID()
			_, err := peer.Forward(ctx, fwd)
			if code(err) != codes.InvalidArgument {
				t.Fatalf("forwarded %s: got %v, want InvalidArgument", name, err)
			}
			// Nothing was proposed: an invalid write that reached the log would have applied by the time
			// a linearizable read on the leader returns.
			if _, err := c.Leases(li).ValidateToken(ctx, &leasepb.ValidateTokenRequest{Resource: "x", Token: 1}); err != nil {
				t.Fatal(err)
			}
			if after := leader.AppliedIndex(); after != before {
				t.Fatalf("forwarded %s moved the leader's applied index from %d to %d", name, before, after)
			}
		})
	}
}

// TestWriteWaitsOutAnElection: a write that reaches a node knowing no leader waits until an election names
// one and is then served, instead of being answered "no leader" at once while the election runs.
func TestWriteWaitsOutAnElection(t *testing.T) {
	c := servertest.Start(t, 3, func(cfg *server.Config) { cfg.TickInterval = 100 * time.Millisecond })
	ctx := ctxT(t)
	li := c.WaitLeader()
	others := []int{(li + 1) % 3, (li + 2) % 3}
	for _, i := range others {
		c.Stop(i)
	}
	// Cut off from a quorum, the leader steps down and knows no leader.
	eventually(t, 10*time.Second, "the leader to step down", func() bool {
		return errors.Is(c.Node(li).Ready(), server.ErrNoLeader)
	})
	// With no election to wait for, the write is answered "no leader" within half of its deadline, in
	// time for its caller to try another node.
	short, cancel := context.WithTimeout(ctx, time.Second)
	_, err := c.Leases(li).Acquire(short, &leasepb.AcquireRequest{Resource: "r", Holder: "h", TtlMs: 10_000})
	cancel()
	if code(err) != codes.Unavailable {
		t.Fatalf("acquire at a node cut off from a quorum: %v, want Unavailable before its deadline", err)
	}
	acquired := make(chan error, 1)
	go func() {
		_, err := c.Leases(li).Acquire(ctx, &leasepb.AcquireRequest{Resource: "r", Holder: "h", TtlMs: 10_000})
		acquired <- err
	}()
	for _, i := range others {
		c.Restart(i)
	}
	if err := <-acquired; err != nil {
		t.Fatalf("acquire sent while no leader was known: %v, want it served once one is elected", err)
	}
	if _, err := c.Leases(li).Get(ctx, &leasepb.GetRequest{Resource: "r"}); err != nil {
		t.Fatalf("the lease acquired during the election: %v", err)
	}
}
