package server_test

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest"
)

func batchAcquire(resource, holder string) *leasepb.BatchWrite {
	return &leasepb.BatchWrite{Write: &leasepb.BatchWrite_Acquire{Acquire: &leasepb.AcquireRequest{Resource: resource, Holder: holder, TtlMs: 30_000}}}
}

func batchRenew(resource string, token uint64) *leasepb.BatchWrite {
	return &leasepb.BatchWrite{Write: &leasepb.BatchWrite_Renew{Renew: &leasepb.RenewRequest{Resource: resource, Token: token}}}
}

func batchRelease(resource string, token uint64) *leasepb.BatchWrite {
	return &leasepb.BatchWrite{Write: &leasepb.BatchWrite_Release{Release: &leasepb.ReleaseRequest{Resource: resource, Token: token}}}
}

// writeOnce sends writes as one request on a new Writes stream to lc and returns its answer; a request
// refused as a whole is the error.
func writeOnce(ctx context.Context, lc leasepb.LeasesClient, writes []*leasepb.BatchWrite) (*leasepb.WritesResponse, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream
	st, err := lc.Writes(ctx)
	if err != nil {
		return nil, err
	}
	if err := st.Send(&leasepb.WritesRequest{Id: 1, Writes: writes}); err != nil {
		return nil, err
	}
	resp, err := st.Recv()
	if err != nil {
		return nil, err
	}
	if resp.GetError() != nil {
		return nil, status.ErrorProto(resp.GetError())
	}
	return resp, nil
}

// resultErr is a batch result's status as the error its own call would have returned.
func resultErr(r *leasepb.BatchResult) error {
	if st := r.GetError(); st != nil {
		return status.ErrorProto(st)
	}
	return nil
}

// TestBatchAnswersEachWriteAsItsOwnCall: the writes of one Writes request, sent to the leader and to a follower
// (which forwards each), are answered one by one, in order, each with what its own call would have
// answered — grants, refusals with their details, renewals, releases, invalid fields — and one failing
// changes nothing for the others.
func TestBatchAnswersEachWriteAsItsOwnCall(t *testing.T) {
	c := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	li := c.WaitLeader()
	take := func(resource, holder string) uint64 {
		resp, err := acquireRetrying(c, ctx, &leasepb.AcquireRequest{Resource: resource, Holder: holder, TtlMs: 30_000})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetLease().GetToken()
	}
	take("b/held", "other")
	for _, through := range []int{li, c.Follower()} {
		p := fmt.Sprintf("b/%d/", through)
		kept, done := take(p+"kept", "h"), take(p+"done", "h")
		resp, err := writeOnce(ctx, c.Leases(through), []*leasepb.BatchWrite{
			batchAcquire(p+"new", "h"),       // 0: granted
			batchAcquire("b/held", "h"),      // 1: held by other
			batchRenew(p+"kept", kept),       // 2: renewed
			batchRelease(p+"done", done),     // 3: released
			batchAcquire("b//bad", "h"),      // 4: an invalid name
			batchRelease(p+"kept", kept+1e6), // 5: not the current token
			batchAcquire(p+"other", "h"),     // 6: granted
		})
		if err != nil {
			t.Fatalf("through node %d: %v", through, err)
		}
		r := resp.GetResults()
		if len(r) != 7 {
			t.Fatalf("through node %d: %d results for 7 writes", through, len(r))
		}
		first, second := r[0].GetAcquire().GetLease(), r[6].GetAcquire().GetLease()
		if first.GetResource() != p+"new" || second.GetResource() != p+"other" || first.GetToken() == second.GetToken() {
			t.Errorf("through node %d: grants %v and %v, want each its own", through, first, second)
		}
		if r[0].GetAcquire().GetHeader().GetLeaderId() == 0 {
			t.Errorf("through node %d: a grant without its response header", through)
		}
		if err := resultErr(r[1]); code(err) != codes.FailedPrecondition || heldDetail(err).GetHolder() != "other" {
			t.Errorf("through node %d: acquire of a held resource = %v, want FailedPrecondition with LeaseHeld", through, err)
		}
		if r[2].GetRenew().GetTtlMs() != 30_000 {
			t.Errorf("through node %d: renew = %v", through, r[2])
		}
		if r[3].GetRelease() == nil {
			t.Errorf("through node %d: release = %v", through, resultErr(r[3]))
		}
		if err := resultErr(r[4]); code(err) != codes.InvalidArgument || badField(err) != "resource" {
			t.Errorf("through node %d: invalid name = %v, want InvalidArgument naming resource", through, err)
		}
		if err := resultErr(r[5]); code(err) != codes.NotFound {
			t.Errorf("through node %d: release of a stale token = %v, want NotFound", through, err)
		}
	}
}

// TestBatchThatBreaksItsOwnLimitsRunsNothing: a batch with no writes, more than 64, a waiting acquire or
// a write of no kind is refused as a whole, InvalidArgument naming what is wrong, and none of its writes runs.
func TestBatchThatBreaksItsOwnLimitsRunsNothing(t *testing.T) {
	c := servertest.Start(t, 1, nil)
	ctx := ctxT(t)
	waiting := batchAcquire("l/w", "h")
	waiting.GetAcquire().Wait = true
	many := make([]*leasepb.BatchWrite, server.MaxBatchWrites+1)
	for i := range many {
		many[i] = batchAcquire(fmt.Sprintf("l/many/%d", i), "h")
	}
	for _, tc := range []struct {
		name   string
		writes []*leasepb.BatchWrite
		field  string
	}{
		{"empty", nil, "writes"},
		{"65 writes", many, "writes"},
		{"a waiting acquire", []*leasepb.BatchWrite{batchAcquire("l/a", "h"), waiting}, "writes[1].acquire.wait"},
		{"a write of no kind", []*leasepb.BatchWrite{batchAcquire("l/b", "h"), {}}, "writes[1]"},
	} {
		_, err := writeOnce(ctx, c.Leases(0), tc.writes)
		if code(err) != codes.InvalidArgument || badField(err) != tc.field {
			t.Errorf("%s: %v, want InvalidArgument naming %s", tc.name, err, tc.field)
		}
	}
	list, err := c.Leases(0).List(ctx, &leasepb.ListRequest{Prefix: "l/"})
	if err != nil || len(list.GetLeases()) != 0 {
		t.Fatalf("after refused batches: %v, %v; want no lease", list.GetLeases(), err)
	}
}

// TestBatchRetriedWriteIsTheSameGrant: an acquire sent again with its request id, in a later request or
// twice in one, is the same grant (decision 5), as for Acquire calls.
func TestBatchRetriedWriteIsTheSameGrant(t *testing.T) {
	c := servertest.Start(t, 1, nil)
	ctx := ctxT(t)
	w := func() *leasepb.BatchWrite {
		return &leasepb.BatchWrite{Write: &leasepb.BatchWrite_Acquire{Acquire: &leasepb.AcquireRequest{
			Resource: "r/same", Holder: "h", TtlMs: 30_000, RequestId: "req-1", Attempt: 1}}}
	}
	var tokens []uint64
	for range 2 {
		resp, err := writeOnce(ctx, c.Leases(0), []*leasepb.BatchWrite{w(), w()})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range resp.GetResults() {
			if err := resultErr(r); err != nil {
				t.Fatalf("a retried acquire: %v, want the same grant", err)
			}
			tokens = append(tokens, r.GetAcquire().GetLease().GetToken())
		}
	}
	for _, tok := range tokens {
		if tok != tokens[0] {
			t.Fatalf("tokens %v, want one grant", tokens)
		}
	}
}
