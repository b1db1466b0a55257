package server_test

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest"
)

type writesStream = grpc.BidiStreamingClient[leasepb.WritesRequest, leasepb.WritesResponse]

// answers reads n answers from a Writes stream, by request id.
func answers(t *testing.T, st writesStream, n int) map[uint64]*leasepb.WritesResponse {
	t.Helper()
	got := make(map[uint64]*leasepb.WritesResponse)
	for len(got) < n {
		resp, err := st.Recv()
		if err != nil {
			t.Fatalf("after %d of %d answers: %v", len(got), n, err)
		}
		if resp.GetDraining() {
			t.Fatal("an unexpected draining notice")
		}
		got[resp.GetId()] = resp
	}
	return got
}

// TestWritesStreamAnswersEachRequestUnderItsID: requests on one Writes stream, to the leader and to a
// follower (which forwards each write), are answered under their ids, each write as its own call would be
// — a grant, a refusal with its details, a renewal, a release — and a request that breaks a batch's limits
// is answered with InvalidArgument naming what is wrong, runs nothing, and leaves the stream working.
func TestWritesStreamAnswersEachRequestUnderItsID(t *testing.T) {
	c := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	li := c.WaitLeader()
	if _, err := acquireRetrying(c, ctx, &leasepb.AcquireRequest{Resource: "w/held", Holder: "other", TtlMs: 30_000}); err != nil {
		t.Fatal(err)
	}
	waiting := batchAcquire("w/never", "h")
	waiting.GetAcquire().Wait = true
	for _, through := range []int{li, c.Follower()} {
		p := fmt.Sprintf("w/%d/", through)
		st, err := c.Leases(through).Writes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		send := func(id uint64, writes ...*leasepb.BatchWrite) {
			if err := st.Send(&leasepb.WritesRequest{Id: id, Writes: writes}); err != nil {
				t.Fatal(err)
			}
		}
		send(1, batchAcquire(p+"a", "h"), batchAcquire("w/held", "h"))
		send(2)                                    // no writes
		send(3, batchAcquire(p+"b", "h"), waiting) // a waiting acquire
		send(4, batchAcquire(p+"c", "h"), batchAcquire(p+"d", "h"))
		got := answers(t, st, 4)
		a, c4 := got[1].GetResults(), got[4].GetResults()
		if len(a) != 2 || a[0].GetAcquire().GetLease().GetResource() != p+"a" {
			t.Fatalf("through node %d: request 1 answered %v", through, got[1])
		}
		if err := resultErr(a[1]); code(err) != codes.FailedPrecondition || heldDetail(err).GetHolder() != "other" {
			t.Errorf("through node %d: acquire of a held resource = %v, want FailedPrecondition with LeaseHeld", through, err)
		}
		if len(c4) != 2 || c4[0].GetAcquire().GetLease().GetToken() == c4[1].GetAcquire().GetLease().GetToken() {
			t.Errorf("through node %d: request 4 answered %v, want two grants", through, got[4])
		}
		for id, field := range map[uint64]string{2: "writes", 3: "writes[1].acquire.wait"} {
			err := status.ErrorProto(got[id].GetError())
			if code(err) != codes.InvalidArgument || badField(err) != field || len(got[id].GetResults()) != 0 {
				t.Errorf("through node %d: request %d answered %v, want InvalidArgument naming %s", through, id, got[id], field)
			}
		}
		// Renew and release what request 4 took, on the same stream.
		token := c4[0].GetAcquire().GetLease().GetToken()
		send(5, batchRenew(p+"c", token), batchRelease(p+"d", c4[1].GetAcquire().GetLease().GetToken()))
		r := answers(t, st, 1)[5].GetResults()
		if len(r) != 2 || r[0].GetRenew().GetTtlMs() != 30_000 || r[1].GetRelease() == nil {
			t.Errorf("through node %d: renew and release answered %v", through, r)
		}
		if err := st.CloseSend(); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); !errors.Is(err, io.EOF) {
			t.Fatalf("through node %d: after the client closed its side: %v, want the stream ended", through, err)
		}
	}
	list, err := c.Leases(li).List(ctx, &leasepb.ListRequest{Prefix: "w/never"})
	if err != nil || len(list.GetLeases()) != 0 {
		t.Fatalf("a refused request's write ran: %v, %v", list.GetLeases(), err)
	}
}

// TestWritesStreamCountsAgainstTheConnectionLimit: the stream counts one call against
// --max-streams-per-conn and each running write one more: a request past the limit is answered
// ResourceExhausted, runs nothing, and the stream goes on.
func TestWritesStreamCountsAgainstTheConnectionLimit(t *testing.T) {
	c := servertest.Start(t, 1, func(cfg *server.Config) { cfg.Limits.MaxStreamsPerConn = 4 })
	ctx := ctxT(t)
	st, err := c.Leases(0).Writes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	writes := func(n int) []*leasepb.BatchWrite {
		w := make([]*leasepb.BatchWrite, n)
		for i := range w {
			w[i] = batchAcquire(fmt.Sprintf("c/%d/%d", n, i), "h")
		}
		return w
	}
	if err := st.Send(&leasepb.WritesRequest{Id: 1, Writes: writes(4)}); err != nil {
		t.Fatal(err)
	}
	if err := status.ErrorProto(answers(t, st, 1)[1].GetError()); code(err) != codes.ResourceExhausted {
		t.Fatalf("4 writes on a stream of a connection allowed 4 calls: %v, want ResourceExhausted", err)
	}
	if err := st.Send(&leasepb.WritesRequest{Id: 2, Writes: writes(3)}); err != nil {
		t.Fatal(err)
	}
	for i, r := range answers(t, st, 1)[2].GetResults() {
		if err := resultErr(r); err != nil {
			t.Fatalf("write %d of 3: %v", i, err)
		}
	}
	list, err := c.Leases(0).List(ctx, &leasepb.ListRequest{Prefix: "c/4/"})
	if err != nil || len(list.GetLeases()) != 0 {
		t.Fatalf("the refused request's writes ran: %v, %v", list.GetLeases(), err)
	}
}

// TestWritesStreamWritesAreAuthorizedOneByOne: with client certificates, every write on the stream belongs
// to the connection's identity and is checked against the ACL on its own.
func TestWritesStreamWritesAreAuthorizedOneByOne(t *testing.T) {
	ca := servertest.NewCA(t)
	c := servertest.StartWithACL(t, 3, ca, "ops", aclTestRules, nil)
	ctx := ctxT(t)
	li := c.WaitLeader()
	conn, err := grpc.NewClient(c.Config(li).ClientAddr, grpc.WithTransportCredentials(credentials.NewTLS(ca.ClientTLS("alice"))))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	st, err := leasepb.NewLeasesClient(conn).Writes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&leasepb.WritesRequest{Id: 7, Writes: []*leasepb.BatchWrite{
		batchAcquire("jobs/mine", "h"), batchAcquire("other/not-mine", "h"),
	}}); err != nil {
		t.Fatal(err)
	}
	r := answers(t, st, 1)[7].GetResults()
	if got := r[0].GetAcquire().GetLease(); got.GetIdentity() != "alice" {
		t.Errorf("alice's acquire under jobs/ = %v, %v; want granted to alice", got, resultErr(r[0]))
	}
	if err := resultErr(r[1]); code(err) != codes.PermissionDenied {
		t.Errorf("alice's acquire outside jobs/ = %v, want PermissionDenied", err)
	}
}

// TestWritesStreamDrainsWhenTheNodeStops: a node that begins to shut down tells the stream's client
// (draining); a request the client sent before it closed its side is still answered, and then the stream
// ends cleanly rather than being cut.
func TestWritesStreamDrainsWhenTheNodeStops(t *testing.T) {
	c := servertest.Start(t, 1, nil)
	ctx := ctxT(t)
	st, err := c.Leases(0).Writes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&leasepb.WritesRequest{Id: 1, Writes: []*leasepb.BatchWrite{batchAcquire("d/before", "h")}}); err != nil {
		t.Fatal(err)
	}
	if err := resultErr(answers(t, st, 1)[1].GetResults()[0]); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- c.Node(0).Close() }() // the node alone: the test's connection stays open
	resp, err := st.Recv()
	if err != nil || !resp.GetDraining() || resp.GetId() != 0 {
		t.Fatalf("when the node began to stop: %v, %v; want a draining notice", resp, err)
	}
	// A request on its way as the notice came: sent, then the client closes its side.
	if err := st.Send(&leasepb.WritesRequest{Id: 2, Writes: []*leasepb.BatchWrite{batchAcquire("d/during", "h")}}); err != nil {
		t.Fatal(err)
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	last := answers(t, st, 1)[2]
	if len(last.GetResults()) != 1 {
		t.Fatalf("the request sent as the node drained was answered %v", last)
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the last answer: %v, want the stream ended cleanly", err)
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
}
