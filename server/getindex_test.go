package server_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server/servertest"
)

// TestGetHeaderIndexIsTheIndexOfTheStateRead: a Get's header.applied_index is the index of the state it
// answered from (issue #11 e), so the lease it returns is still current at that index: its release comes
// after it. The header used to be stamped after the read, with whatever had been applied meanwhile.
func TestGetHeaderIndexIsTheIndexOfTheStateRead(t *testing.T) {
	c := servertest.Start(t, 1, nil)
	ctx := ctxT(t)
	lc := c.Leases(0)
	const rounds = 300
	// Every event on the resource, from the start: the index at which each grant was released.
	released := map[uint64]uint64{} // token -> release index
	var mu sync.Mutex
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	stream, err := lc.Watch(wctx, &leasepb.WatchRequest{Resource: "idx/x", FromIndex: 1})
	if err != nil {
		t.Fatal(err)
	}
	var watched sync.WaitGroup
	watched.Go(func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			mu.Lock()
			for _, e := range resp.GetEvents() {
				if e.GetType() == leasepb.EventType_EVENT_TYPE_RELEASED {
					released[e.GetLease().GetToken()] = e.GetIndex()
				}
			}
			mu.Unlock()
		}
	})
	// A writer grants and releases the resource as fast as it can.
	var wrote sync.WaitGroup
	wctx2, stopWrites := context.WithCancel(ctx)
	defer stopWrites()
	wrote.Go(func() {
		for i := 0; wctx2.Err() == nil; i++ {
			resp, err := lc.Acquire(wctx2, &leasepb.AcquireRequest{Resource: "idx/x", Holder: "w", TtlMs: 60_000, RequestId: fmt.Sprint(i)})
			if err != nil {
				continue
			}
			_, _ = lc.Release(wctx2, &leasepb.ReleaseRequest{Resource: "idx/x", Token: resp.GetLease().GetToken()})
		}
	})
	type seen struct{ token, applied uint64 }
	var seens []seen
	for len(seens) < rounds {
		resp, err := lc.Get(ctx, &leasepb.GetRequest{Resource: "idx/x", Serializable: true})
		if err != nil {
			continue // free at that moment
		}
		seens = append(seens, seen{resp.GetLease().GetToken(), resp.GetHeader().GetAppliedIndex()})
	}
	stopWrites()
	wrote.Wait()
	last := seens[len(seens)-1].token
	_, _ = lc.Release(ctx, &leasepb.ReleaseRequest{Resource: "idx/x", Token: last}) // if the writer stopped first
	eventually(t, 5*time.Second, "the watch to see the releases", func() bool {
		mu.Lock()
		defer mu.Unlock()
		_, ok := released[last]
		return ok
	})
	stopWatch()
	watched.Wait()
	mu.Lock()
	defer mu.Unlock()
	for _, s := range seens {
		r, ok := released[s.token]
		if s.applied < s.token || (ok && s.applied >= r) {
			t.Fatalf("Get answered token %d with applied_index %d, but that grant was released at %d", s.token, s.applied, r)
		}
	}
}
