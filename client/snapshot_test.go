package client_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server/servertest"
)

// TestSnapshotOfARealClusterSpansChunks backs up a real cluster whose state is larger than one 1 MiB
// chunk: the SDK reassembles and verifies it, and the bytes are a snapshot holding every lease.
func TestSnapshotOfARealClusterSpansChunks(t *testing.T) {
	cl := servertest.Start(t, 3, nil)
	c := newClient(t, cl.Endpoints(), nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	value := bytes.Repeat([]byte("v"), 4096)
	const n = 300      // 300 × 4 KiB values: about 1.2 MiB of state
	for i := range n { // raw acquires: no SDK keep-alive for each of them
		resource := fmt.Sprintf("snap/%03d", i)
		req := &leasepb.AcquireRequest{Resource: resource, Holder: "h", TtlMs: time.Hour.Milliseconds(), Value: value, RequestId: resource}
		acquireOnLeader(t, ctx, cl, req)
	}
	var buf bytes.Buffer
	info, err := c.Snapshot(ctx, &buf)
	if err != nil {
		t.Fatal(err)
	}
	if buf.Len() <= 1<<20 || info.Size != int64(buf.Len()) {
		t.Fatalf("snapshot of %d bytes (info %+v), want more than one chunk", buf.Len(), info)
	}
	sm, err := fsm.Restore(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if sm.Len() != n || sm.AppliedIndex() != info.AppliedIndex {
		t.Fatalf("snapshot holds %d leases at %d, want %d at %d", sm.Len(), sm.AppliedIndex(), n, info.AppliedIndex)
	}
}

// acquireOnLeader sends req to the leader, and again, with the same request id, to the leader after a
// leader change: a loaded machine may move leadership while a test builds its state.
func acquireOnLeader(t *testing.T, ctx context.Context, cl *servertest.Cluster, req *leasepb.AcquireRequest) {
	t.Helper()
	for {
		callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := cl.Leases(cl.WaitLeader()).Acquire(callCtx, req)
		cancel()
		switch status.Code(err) {
		case codes.OK:
			return
		case codes.Unavailable, codes.DeadlineExceeded:
			if ctx.Err() != nil {
				t.Fatalf("acquire %s: %v", req.GetResource(), err)
			}
		default:
			t.Fatalf("acquire %s: %v", req.GetResource(), err)
		}
	}
}
