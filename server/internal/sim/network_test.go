package sim

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/wirepb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is an Endpoint that keeps the index of every message it receives, with its arrival time.
type recorder struct {
	mu      sync.Mutex
	got     []uint64
	at      []time.Time
	forward int
}

func (r *recorder) Process(_ context.Context, m *raftpb.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, m.GetIndex())
	r.at = append(r.at, time.Now())
	return nil
}
func (r *recorder) ReportUnreachable(uint64)                   {}
func (r *recorder) ReportSnapshot(uint64, raft.SnapshotStatus) {}
func (r *recorder) Forward(context.Context, *wirepb.ForwardRequest) (*wirepb.ForwardResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.forward++
	return &wirepb.ForwardResponse{}, nil
}

func (r *recorder) Join(context.Context, *wirepb.JoinRequest) (*wirepb.JoinResponse, error) {
	return &wirepb.JoinResponse{}, nil
}

func msgs(from, to uint64, n int) []*raftpb.Message {
	out := make([]*raftpb.Message, n)
	for i := range out {
		out[i] = &raftpb.Message{From: new(from), To: new(to), Index: new(uint64(i + 1))}
	}
	return out
}

// delivered sends n messages from 1 to 2 on a fresh network with the given seed and faults, and returns
// what node 2 received, sorted.
func delivered(t *testing.T, seed uint64, f Faults, n int) []uint64 {
	var got []uint64
	synctest.Test(t, func(t *testing.T) {
		net := New(seed)
		defer net.Close()
		r := &recorder{}
		net.Attach(2, r)
		net.Attach(1, &recorder{})
		net.SetFaults(f)
		net.Transport(1).Send(msgs(1, 2, n))
		time.Sleep(time.Second)
		synctest.Wait()
		r.mu.Lock()
		got = slices.Sorted(slices.Values(r.got))
		r.mu.Unlock()
	})
	return got
}

func TestSameSeedDropsTheSameMessages(t *testing.T) {
	f := Faults{Drop: 0.3, MaxDelay: 50 * time.Millisecond}
	a, b := delivered(t, 42, f, 300), delivered(t, 42, f, 300)
	if !slices.Equal(a, b) {
		t.Fatalf("seed 42 delivered %d then %d messages, or different ones", len(a), len(b))
	}
	if len(a) < 150 || len(a) > 270 {
		t.Fatalf("%d of 300 delivered with a 30%% drop rate", len(a))
	}
	if c := delivered(t, 43, f, 300); slices.Equal(a, c) {
		t.Fatal("seeds 42 and 43 dropped the same messages")
	}
}

func TestDelaysReorderAndTakeVirtualTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		net := New(1)
		defer net.Close()
		r := &recorder{}
		net.Attach(2, r)
		net.SetFaults(Faults{MinDelay: 100 * time.Millisecond, MaxDelay: 200 * time.Millisecond})
		start := time.Now()
		net.Transport(1).Send(msgs(1, 2, 50))
		time.Sleep(time.Second)
		r.mu.Lock()
		defer r.mu.Unlock()
		if len(r.got) != 50 {
			t.Fatalf("%d of 50 delivered", len(r.got))
		}
		for _, at := range r.at {
			if d := at.Sub(start); d < 100*time.Millisecond || d > 200*time.Millisecond {
				t.Fatalf("a message took %v, outside the 100-200ms delay", d)
			}
		}
		if slices.IsSorted(r.got) {
			t.Fatal("random delays did not reorder 50 messages")
		}
	})
}

func TestCutsPartitionsAndHeal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		net := New(1)
		defer net.Close()
		rs := map[uint64]*recorder{1: {}, 2: {}, 3: {}}
		for id, r := range rs {
			net.Attach(id, r)
		}
		reach := func() (out [4][4]bool) {
			for a := uint64(1); a <= 3; a++ {
				for b := uint64(1); b <= 3; b++ {
					out[a][b] = a != b && net.Reachable(a, b)
				}
			}
			return out
		}
		net.CutOneWay(1, 2)
		if r := reach(); r[1][2] || !r[2][1] || !r[1][3] {
			t.Fatalf("one-way cut 1->2: %v", r)
		}
		net.Heal()
		net.Partition([]uint64{1}, []uint64{2, 3})
		if r := reach(); r[1][2] || r[2][1] || r[1][3] || r[3][1] || !r[2][3] {
			t.Fatalf("partition {1} {2,3}: %v", r)
		}
		// A forwarded request does not cross the partition; it does once healed.
		c, _ := net.Transport(2).PeerClient(1)
		if _, err := c.Forward(context.Background(), &wirepb.ForwardRequest{}); status.Code(err) != codes.Unavailable {
			t.Fatalf("forward across a partition: %v", err)
		}
		net.Heal()
		net.Isolate(3)
		if r := reach(); !r[1][2] || !r[2][1] || r[3][1] || r[2][3] {
			t.Fatalf("isolate 3: %v", r)
		}
		net.Transport(1).Send(msgs(1, 3, 5))
		net.Transport(1).Send(msgs(1, 2, 5))
		net.Heal()
		if _, err := c.Forward(context.Background(), &wirepb.ForwardRequest{}); err != nil {
			t.Fatalf("forward after heal: %v", err)
		}
		synctest.Wait()
		if len(rs[3].got) != 0 || len(rs[2].got) != 5 || rs[1].forward != 1 {
			t.Fatalf("delivered to the isolated node: %d, to the connected one: %d, forwards: %d", len(rs[3].got), len(rs[2].got), rs[1].forward)
		}
	})
}
