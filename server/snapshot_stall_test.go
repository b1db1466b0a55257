package server_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest"
)

// TestSnapshotReaderThatStopsReadingIsCutOff: two backups whose client never reads hold both Snapshot
// slots (a third is refused) until the stall watchdog ends them (2 s here); then backups work again, and the
// stalled clients see DeadlineExceeded.
func TestSnapshotReaderThatStopsReadingIsCutOff(t *testing.T) {
	defer server.SetSnapshotStall(2 * time.Second)()
	c := servertest.Start(t, 1, nil)
	ctx := ctxT(t)
	// A state of ~2.4 MB, three chunks: gRPC's Send returns once a chunk is queued, and blocks on the
	// next while the client's 64 KiB window keeps the first unsent.
	value := bytes.Repeat([]byte("v"), 4000)
	for i := range 600 {
		if _, err := acquireRetrying(c, ctx, &leasepb.AcquireRequest{Resource: fmt.Sprintf("big/%d", i), Holder: "h",
			TtlMs: 60_000, Value: value, RequestId: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	addr := c.Config(0).ClientAddr
	// A client that never reads: a fixed, small window (no BDP growth), and no Recv.
	slow, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(1<<16), grpc.WithInitialConnWindowSize(1<<16))
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	var stalled []leasepb.Cluster_SnapshotClient
	for range server.MaxSnapshotStreams {
		st, err := leasepb.NewClusterClient(slow).Snapshot(ctx, &leasepb.SnapshotRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Header(); err != nil { // the server has begun sending: it holds a slot
			t.Fatal(err)
		}
		stalled = append(stalled, st)
	}
	normal := leasepb.NewClusterClient(c.Conn(0))
	try := func() codes.Code {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		st, err := normal.Snapshot(sctx, &leasepb.SnapshotRequest{})
		for err == nil {
			var chunk *leasepb.SnapshotChunk
			if chunk, err = st.Recv(); err == nil && chunk.GetRemainingBytes() == 0 {
				return codes.OK
			}
		}
		return status.Code(err)
	}
	// Once the stalled streams hold both slots, a backup is refused (one that came before they took
	// them may be served); once the watchdog ended them, backups are served again.
	waitFor := func(want codes.Code) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			code := try()
			if code == want {
				return
			}
			if code != codes.OK && code != codes.ResourceExhausted {
				t.Fatalf("backup: %v", code)
			}
			if time.Now().After(deadline) {
				t.Fatalf("backups never answered %v (last: %v)", want, code)
			}
		}
	}
	waitFor(codes.ResourceExhausted)
	waitFor(codes.OK)
	// One free slot serves a backup; wait until the watchdog has ended both stalled streams (two probes,
	// each having taken a chunk, are served at once), so that reading them below cannot let a stream
	// still being served finish: on a busy machine one could end a tick after the other.
	bothFree := func() bool {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel() // ends the probes, freeing their slots
		for range server.MaxSnapshotStreams {
			st, err := leasepb.NewClusterClient(slow).Snapshot(pctx, &leasepb.SnapshotRequest{})
			if err != nil {
				return false
			}
			if _, err := st.Recv(); err != nil { // a chunk: served (a refusal ends with ResourceExhausted)
				return false
			}
		}
		return true
	}
	eventually(t, 15*time.Second, "both stalled streams ended by the watchdog", bothFree)
	for i, st := range stalled {
		var err error
		for err == nil {
			_, err = st.Recv()
		}
		if status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("stalled stream %d ended with %v, want DeadlineExceeded", i, err)
		}
	}
}
