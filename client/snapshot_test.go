package client_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

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
	const n = 300 // 300 × 4 KiB values: about 1.2 MiB of state
	leader := cl.Leases(cl.WaitLeader())
	for i := range n { // raw acquires: no SDK keep-alive for each of them
		req := &leasepb.AcquireRequest{Resource: fmt.Sprintf("snap/%03d", i), Holder: "h", TtlMs: time.Hour.Milliseconds(), Value: value}
		if _, err := leader.Acquire(ctx, req); err != nil {
			t.Fatal(err)
		}
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
