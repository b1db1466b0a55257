package client_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/client"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest"
)

// breakingWatch serves Watch streams that each deliver the events script gives for their from_index and
// then break with Unavailable; it records every from_index asked for.
type breakingWatch struct {
	leasepb.UnimplementedLeasesServer
	script func(call int, from uint64) []uint64 // the indexes to deliver; nil: block until cancelled
	fail   func(call int) error                 // when set and not nil for a call, that call fails at once

	mu    sync.Mutex
	froms []uint64
}

func (f *breakingWatch) Watch(req *leasepb.WatchRequest, stream grpc.ServerStreamingServer[leasepb.WatchResponse]) error {
	f.mu.Lock()
	call := len(f.froms)
	f.froms = append(f.froms, req.GetFromIndex())
	f.mu.Unlock()
	if f.fail != nil {
		if err := f.fail(call); err != nil {
			return err
		}
	}
	idx := f.script(call, req.GetFromIndex())
	if idx == nil {
		<-stream.Context().Done()
		return stream.Context().Err()
	}
	for _, i := range idx {
		ev := &leasepb.Event{Type: leasepb.EventType_EVENT_TYPE_GRANTED, Index: i, Lease: &leasepb.Lease{Resource: "w", Token: i}}
		if err := stream.Send(&leasepb.WatchResponse{Events: []*leasepb.Event{ev}}); err != nil {
			return err
		}
	}
	return status.Error(codes.Unavailable, "injected: stream broken")
}

func (f *breakingWatch) asked() []uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.froms)
}

// TestWatchResumesFromTheLastDeliveredIndex is issue #11 (d): a watch that asked to start from an index
// resumes a broken stream from the caller's index while nothing was delivered, then from the last
// delivered index + 1 — never from "now".
func TestWatchResumesFromTheLastDeliveredIndex(t *testing.T) {
	f := &breakingWatch{script: func(call int, from uint64) []uint64 {
		switch call {
		case 0:
			return []uint64{} // breaks before delivering anything
		case 1:
			return []uint64{from, from + 3}
		case 2:
			return []uint64{}
		}
		return nil
	}}
	c := newClient(t, []string{serveLeases(t, f)}, nil)
	got, err := watchUntil(t, c, client.WatchOptions{Resource: "w", FromIndex: 5}, func() bool { return len(f.asked()) >= 4 })
	if want := []uint64{5, 5, 9, 9}; !slices.Equal(f.asked(), want) {
		t.Fatalf("from_index asked %v, want %v (delivered %v, err %v)", f.asked(), want, got, err)
	}
	if want := []uint64{5, 8}; !slices.Equal(got, want) {
		t.Fatalf("delivered %v, want %v", got, want)
	}
}

// watchUntil runs c.Watch until done() holds (polled) or 5s pass, and returns the indexes delivered.
func watchUntil(t *testing.T, c *client.Client, wo client.WatchOptions, done func() bool) ([]uint64, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	var (
		mu  sync.Mutex
		got []uint64
	)
	errc := make(chan error, 1)
	go func() {
		errc <- c.Watch(ctx, wo, func(e client.Event) error {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, e.Index)
			return nil
		})
	}()
	for deadline := time.Now().Add(5 * time.Second); !done() && time.Now().Before(deadline); {
		select {
		case err := <-errc:
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(got), err
		case <-time.After(10 * time.Millisecond): // poll interval
		}
	}
	cancel()
	err := <-errc
	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(got), err
}

// A resumed watch whose next index the node no longer keeps ends with ErrCompacted, not with events
// from "now".
func TestWatchResumeBeyondTheHistoryIsCompacted(t *testing.T) {
	f := &breakingWatch{script: func(call int, from uint64) []uint64 { return []uint64{from} }}
	compacted := func(call int) error {
		if call == 1 {
			st, _ := status.New(codes.OutOfRange, "compacted").WithDetails(&leasepb.WatchCompacted{OldestIndex: 100})
			return st.Err()
		}
		return nil
	}
	f.fail = compacted
	c := newClient(t, []string{serveLeases(t, f)}, nil)
	got, err := watchUntil(t, c, client.WatchOptions{Resource: "w", FromIndex: 5}, func() bool { return false })
	var ce *client.CompactedError
	if !errors.As(err, &ce) || ce.OldestIndex != 100 || !errors.Is(err, client.ErrCompacted) {
		t.Fatalf("want a CompactedError naming 100, got %v (delivered %v, asked %v)", err, got, f.asked())
	}
	if want := []uint64{5, 6}; !slices.Equal(f.asked(), want) {
		t.Fatalf("from_index asked %v, want %v", f.asked(), want)
	}
}

// listingWatch is a breakingWatch whose List answers with applied index 41.
type listingWatch struct{ *breakingWatch }

func (f listingWatch) List(context.Context, *leasepb.ListRequest) (*leasepb.ListResponse, error) {
	return &leasepb.ListResponse{Header: &leasepb.ResponseHeader{AppliedIndex: 41}}, nil
}

// A watch "from now" whose stream breaks before delivering anything resumes from the index "now" was,
// not from a later "now" (the events in between used to be skipped).
func TestWatchFromNowResumesFromWhereNowWas(t *testing.T) {
	f := &breakingWatch{script: func(call int, from uint64) []uint64 {
		if call == 0 {
			return []uint64{}
		}
		return nil
	}}
	c := newClient(t, []string{serveLeases(t, listingWatch{f})}, nil)
	got, err := watchUntil(t, c, client.WatchOptions{Resource: "w"}, func() bool { return len(f.asked()) >= 2 })
	if want := []uint64{42, 42}; !slices.Equal(f.asked(), want) {
		t.Fatalf("from_index asked %v, want %v (delivered %v, err %v)", f.asked(), want, got, err)
	}
}

// observedElection holds "e" at token 10 in a state read at index 12, while the node's applied index (which
// a List's header carries) is already 15; a free election is Get-NotFound with a List at 15.
type observedElection struct {
	*breakingWatch
	held bool
}

func (f observedElection) Get(context.Context, *leasepb.GetRequest) (*leasepb.GetResponse, error) {
	if !f.held {
		return nil, status.Error(codes.NotFound, "no lease")
	}
	return &leasepb.GetResponse{
		Header: &leasepb.ResponseHeader{AppliedIndex: 12},
		Lease:  &leasepb.Lease{Resource: "e", Holder: "a", Token: 10, TtlMs: 1000},
	}, nil
}

func (f observedElection) List(context.Context, *leasepb.ListRequest) (*leasepb.ListResponse, error) {
	var ls []*leasepb.Lease
	if f.held {
		ls = []*leasepb.Lease{{Resource: "e", Holder: "a", Token: 10, TtlMs: 1000}}
	}
	return &leasepb.ListResponse{Header: &leasepb.ResponseHeader{AppliedIndex: 15}, Leases: ls}, nil
}

// TestObserveWatchesFromTheIndexOfTheStateItRead is issue #11 (e): Observe watches from the index after
// the state it reported. It used to take the index from a List header stamped after the read (15 here),
// missing the events between (13 and 14).
func TestObserveWatchesFromTheIndexOfTheStateItRead(t *testing.T) {
	for _, tc := range []struct {
		held   bool
		holder string
		from   uint64
	}{{true, "a", 13}, {false, "", 16}} {
		f := &breakingWatch{script: func(int, uint64) []uint64 { return nil }}
		c := newClient(t, []string{serveLeases(t, observedElection{f, tc.held})}, nil)
		ctx, cancel := context.WithCancel(ctxT(t))
		seen := make(chan client.LeaderInfo, 1)
		errc := make(chan error, 1)
		go func() {
			errc <- c.Observe(ctx, "e", func(li client.LeaderInfo) error { seen <- li; return nil })
		}()
		if li := <-seen; li.Holder != tc.holder {
			t.Errorf("held %v: first observed %+v, want holder %q", tc.held, li, tc.holder)
		}
		for deadline := time.Now().Add(5 * time.Second); len(f.asked()) == 0 && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond) // poll interval
		}
		cancel()
		<-errc
		if want := []uint64{tc.from}; !slices.Equal(f.asked(), want) {
			t.Errorf("held %v: watched from %v, want %v", tc.held, f.asked(), want)
		}
	}
}

// TestWatchPastALimitReturnsErrLimit: a node that refuses a watch for one of its limits (here one
// watcher per connection, and the SDK keeps one connection per node) answers ResourceExhausted with a
// QuotaFailure; Watch returns it as ErrLimit naming the flag instead of resuming forever, as it does for
// a watcher that fell behind.
func TestWatchPastALimitReturnsErrLimit(t *testing.T) {
	cl := servertest.Start(t, 1, func(cfg *server.Config) { cfg.Limits.MaxWatchersPerConn = 1 })
	c := newClient(t, cl.Endpoints(), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	firstCtx, stopFirst := context.WithCancel(ctx)
	first := make(chan error, 1)
	go func() {
		first <- c.Watch(firstCtx, client.WatchOptions{Prefix: "a/"}, func(client.Event) error { return nil })
	}()
	deadline := time.Now().Add(10 * time.Second)
	for cl.Node(0).Watchers() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the first watch was not served")
		}
		time.Sleep(10 * time.Millisecond) // polling the node's count
	}
	err := c.Watch(ctx, client.WatchOptions{Prefix: "b/"}, func(client.Event) error { return nil })
	if !errors.Is(err, client.ErrLimit) || !strings.Contains(err.Error(), "--max-watchers-per-conn") {
		t.Fatalf("second watch: %v, want ErrLimit naming --max-watchers-per-conn", err)
	}
	stopFirst()
	if err := <-first; !errors.Is(err, context.Canceled) {
		t.Fatalf("first watch ended with %v", err)
	}
}
