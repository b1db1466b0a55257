package loadgen_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/client"
	"github.com/leased/leased/client/loadgen"
	"github.com/leased/leased/server/servertest"
)

// Fill calls fn once for every index, whatever worker runs it.
func TestFillRunsEveryIndexOnce(t *testing.T) {
	var mu sync.Mutex
	seen := map[int]int{}
	err := loadgen.Fill(context.Background(), loadgen.Options{Clients: 8, Duration: time.Minute, MaxOps: 500}, func(_ context.Context, i int) error {
		mu.Lock()
		defer mu.Unlock()
		seen[i]++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 500 {
		if seen[i] != 1 {
			t.Fatalf("index %d ran %d times", i, seen[i])
		}
	}
	if len(seen) != 500 {
		t.Fatalf("%d indexes ran, want 500", len(seen))
	}
	if err := loadgen.Fill(context.Background(), loadgen.Options{Clients: 1, Duration: time.Second}, func(context.Context, int) error {
		t.Error("MaxOps 0 ran something")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// Fill's error is the first failure, not the cancellations it causes in the calls in flight, and no call
// starts after it.
func TestFillStopsAtTheFirstFailure(t *testing.T) {
	boom := errors.New("boom")
	var mu sync.Mutex
	ran := 0
	err := loadgen.Fill(context.Background(), loadgen.Options{Clients: 4, Duration: time.Minute, MaxOps: 10_000}, func(ctx context.Context, i int) error {
		mu.Lock()
		ran++
		mu.Unlock()
		if i == 10 {
			return boom
		}
		if i > 10 {
			<-ctx.Done() // the calls in flight when the failure comes end with it
			return ctx.Err()
		}
		return nil
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err %v, want boom", err)
	}
	if ran > 20 {
		t.Fatalf("%d calls ran after a failure at index 10", ran)
	}
}

// A fill that cannot finish within its duration says how far it got.
func TestFillIncompleteWithinDuration(t *testing.T) {
	err := loadgen.Fill(context.Background(), loadgen.Options{Clients: 1, Duration: 30 * time.Millisecond, MaxOps: 1000}, func(ctx context.Context, _ int) error {
		select {
		case <-time.After(5 * time.Millisecond): // each call takes a while: 1,000 of them do not fit
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	if !errors.Is(err, loadgen.ErrIncomplete) || !strings.Contains(err.Error(), "of 1000") {
		t.Fatalf("err %v, want ErrIncomplete", err)
	}
}

// Workers taking turns renew every lease equally often.
func TestBatchStartTakesTurnsThroughTheLeases(t *testing.T) {
	const workers, leases, batch = 3, 12, 2
	count := make([]int, leases)
	for seq := range 4 { // 4 × 3 batches of 2 = twice through 12 leases
		for w := range workers {
			first := loadgen.BatchStart(w, seq, workers, leases, batch)
			for i := range batch {
				count[(first+i)%leases]++
			}
		}
	}
	for i, n := range count {
		if n != 2 {
			t.Fatalf("lease %d renewed %d times, want 2: %v", i, n, count)
		}
	}
}

func TestKeepAliveOptionsValidate(t *testing.T) {
	if err := (loadgen.KeepAliveOptions{Leases: 20_000, Batch: 1000, Streams: 4}).Validate(); err != nil {
		t.Fatalf("the defaults refused: %v", err)
	}
	for _, o := range []loadgen.KeepAliveOptions{
		{Leases: 0, Batch: 1, Streams: 1},
		{Leases: loadgen.MaxLeases + 1, Batch: 1, Streams: 1},
		{Leases: 10, Batch: 0, Streams: 1},
		{Leases: 20_000, Batch: loadgen.MaxBatch + 1, Streams: 1},
		{Leases: 10, Batch: 11, Streams: 1},
		{Leases: 10, Batch: 1, Streams: 0},
		{Leases: 10, Batch: 1, Streams: loadgen.MaxClients + 1},
	} {
		if err := o.Validate(); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
}

// stalledLeases is a LeasesClient whose KeepAlive streams never answer: they end only when their
// context does. It counts the streams opened.
type stalledLeases struct {
	leasepb.LeasesClient
	mu     sync.Mutex
	opened int
}

func (s *stalledLeases) KeepAlive(ctx context.Context, _ ...grpc.CallOption) (grpc.BidiStreamingClient[leasepb.KeepAliveRequest, leasepb.KeepAliveResponse], error) {
	s.mu.Lock()
	s.opened++
	s.mu.Unlock()
	return &stalledStream{ctx: ctx}, nil
}

type stalledStream struct {
	grpc.ClientStream
	ctx context.Context
}

func (s *stalledStream) Send(*leasepb.KeepAliveRequest) error { return s.ctx.Err() }
func (s *stalledStream) CloseSend() error                     { return nil }
func (s *stalledStream) Recv() (*leasepb.KeepAliveResponse, error) {
	<-s.ctx.Done()
	return nil, s.ctx.Err()
}

// An operation's timeout cuts a stream that does not answer (Recv has no deadline of its own), and the
// worker's next operation opens a fresh one.
func TestKeepAliveOperationTimeoutCutsTheStream(t *testing.T) {
	api := &stalledLeases{}
	refs := []*leasepb.LeaseRef{{Resource: "a", Token: 1}, {Resource: "b", Token: 2}}
	ka, err := loadgen.OpenKeepAlive(context.Background(), api, refs, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	r, err := loadgen.Run(context.Background(), loadgen.Options{Clients: 1, Duration: time.Minute, MaxOps: 3, OpTimeout: 20 * time.Millisecond}, ka.Op())
	ka.Close()
	if err != nil {
		t.Fatal(err)
	}
	if r.Errors != 3 || !errors.Is(r.FirstErr, context.DeadlineExceeded) || ka.Renewed() != 0 {
		t.Fatalf("%+v, renewed %d", r, ka.Renewed())
	}
	if api.opened != 3 { // one by OpenKeepAlive, one more after each of the first two cuts
		t.Fatalf("opened %d streams, want 3", api.opened)
	}
}

// testKeepAlive takes leases through the raw API on the leader, renews them in batches, sees a released
// one answered as gone, and releases them all.
func testKeepAlive(t *testing.T, sdk *client.Client, leaderEp string) {
	ctx := context.Background()
	leader, err := loadgen.Leader(ctx, sdk)
	if err != nil || leader != leaderEp {
		t.Fatalf("Leader = %q, %v; want %q", leader, err, leaderEp)
	}
	conn, err := loadgen.Dial(leader, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	api := leasepb.NewLeasesClient(conn)
	fill := loadgen.Options{Clients: 8, Duration: time.Minute, MaxOps: 300, OpTimeout: 10 * time.Second}
	// The SDK's errors: a TTL the cluster refuses is ErrInvalid, and nothing is taken.
	if refs, err := loadgen.TakeLeases(ctx, api, fill, "ka-short", time.Millisecond); !errors.Is(err, client.ErrInvalid) || len(refs) != 0 {
		t.Fatalf("TakeLeases with a 1ms TTL: %d taken, %v", len(refs), err)
	}
	refs, err := loadgen.TakeLeases(ctx, api, fill, "ka", 30*time.Second)
	if err != nil || len(refs) != 300 || refs[7].GetResource() != "ka/7" || refs[7].GetToken() == 0 {
		t.Fatalf("TakeLeases: %d, %v", len(refs), err)
	}
	info, err := sdk.Get(ctx, "ka/299")
	if err != nil || info.Holder != "ka-0" {
		t.Fatalf("ka/299: %+v, %v", info, err)
	}

	ka, err := loadgen.OpenKeepAlive(ctx, api, refs, 2, 100)
	if err != nil {
		t.Fatal(err)
	}
	defer ka.Close()
	run := loadgen.Options{Clients: 2, Duration: time.Minute, MaxOps: 12, OpTimeout: 10 * time.Second}
	r, err := loadgen.Run(ctx, run, ka.Op())
	if err != nil || r.Ops != 12 || r.Errors != 0 || ka.Renewed() != 1200 || ka.Gone() != 0 {
		t.Fatalf("%+v (err %v), renewed %d, gone %d", r, err, ka.Renewed(), ka.Gone())
	}
	// Worker 0's first batch is refs[0..99]; with refs[0] released, the other 99 still count.
	if _, err := api.Release(ctx, &leasepb.ReleaseRequest{Resource: refs[0].GetResource(), Token: refs[0].GetToken()}); err != nil {
		t.Fatal(err)
	}
	run.Clients, run.MaxOps = 1, 1
	r, err = loadgen.Run(ctx, run, ka.Op())
	if err != nil || r.Errors != 1 || !strings.Contains(r.FirstErr.Error(), "1 of 100 leases not renewed") || ka.Renewed() != 1299 || ka.Gone() != 1 {
		t.Fatalf("%+v (err %v), renewed %d, gone %d", r, err, ka.Renewed(), ka.Gone())
	}
	ka.Close()

	// Releasing: refs[0]'s second release is acknowledged too (Release is safe to retry).
	n, err := loadgen.ReleaseLeases(ctx, api, loadgen.Options{Clients: 8, Duration: time.Minute, OpTimeout: 10 * time.Second}, refs)
	if err != nil || n != 300 {
		t.Fatalf("ReleaseLeases: %d, %v", n, err)
	}
	if left, _, err := sdk.List(ctx, client.ListOptions{Prefix: "ka/"}); err != nil || len(left) != 0 {
		t.Fatalf("after release: %d left, %v", len(left), err)
	}
}

// TestAgainstCluster runs the loads that need a cluster against one in-process three-node cluster.
func TestAgainstCluster(t *testing.T) {
	c := servertest.Start(t, 3, nil)
	eps := c.Endpoints()
	sdk, err := client.New(client.Config{Endpoints: eps})
	if err != nil {
		t.Fatal(err)
	}
	defer sdk.Close()
	t.Run("KeepAlive", func(t *testing.T) { testKeepAlive(t, sdk, eps[c.WaitLeader()]) })
	t.Run("Failover", func(t *testing.T) { testFailover(t, sdk, eps) })
}
