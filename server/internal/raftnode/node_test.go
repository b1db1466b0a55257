package raftnode

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/leased/leased/server/internal/clock"
	"github.com/leased/leased/server/internal/errs"
	"github.com/leased/leased/server/internal/sim"
)

// recordingApplier is the layer above a test's Node: it keeps the data of the entries applied and answers
// each proposer with that data, found by the proposal id its first 8 bytes carry.
type recordingApplier struct {
	w       *Waiter[string]
	mu      sync.Mutex
	applied uint64
	data    []string
}

func (a *recordingApplier) Apply(ents []*raftpb.Entry) error {
	for _, e := range ents {
		a.mu.Lock()
		a.applied = e.GetIndex()
		if e.GetType() == raftpb.EntryNormal && len(e.GetData()) >= 8 {
			a.data = append(a.data, string(e.GetData()[8:]))
		}
		a.mu.Unlock()
		if e.GetType() == raftpb.EntryNormal && len(e.GetData()) >= 8 {
			a.w.Deliver(binary.BigEndian.Uint64(e.GetData()), Outcome[string]{Index: e.GetIndex(), Result: string(e.GetData()[8:])})
		}
	}
	return nil
}

func (a *recordingApplier) Decode([]byte) (Restore, error) {
	return nil, errors.New("a single voter is never sent a snapshot")
}

func (a *recordingApplier) Applied() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.applied
}

func (a *recordingApplier) WaitApplied(ctx context.Context, index uint64, stopped <-chan struct{}) error {
	tick := time.NewTicker(time.Millisecond) // poll interval
	defer tick.Stop()
	for a.Applied() < index {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-stopped:
			return errs.ErrStopped
		case <-tick.C:
		}
	}
	return nil
}

func (a *recordingApplier) Freeze() SnapshotView { panic("no snapshot is due in this test") }

// TestNodeHandsCommittedEntriesToItsApplier: the Node, alone and without package server, elects itself,
// tells its Handler, appends a proposal, hands the committed entry to its Applier, whose answer reaches
// the proposer through the Waiter; a linearizable read waits for the applier; Stop ends Run and the
// Handler hears the loop stop.
func TestNodeHandsCommittedEntriesToItsApplier(t *testing.T) {
	w := NewWaiter[string]()
	app := &recordingApplier{w: w}
	led, stopped := make(chan uint64, 1), make(chan struct{})
	storage := sim.NewStorage()
	n := New(Config{
		ID: 1, TickInterval: 10 * time.Millisecond, ElectionTicks: 10, HeartbeatTicks: 1,
		ProposalTimeout: 5 * time.Second, DiskStallTimeout: time.Minute, SnapshotEntries: 1 << 20,
		Clock: clock.Real{}, Log: slog.New(slog.DiscardHandler), Storage: storage, Writer: storage,
		Snapshot: &raftpb.Snapshot{}, DiskPath: func(string) string { return "memory" },
		Applier: app, Proposers: w, Send: func([]*raftpb.Message) {},
		IsMember: func(id uint64) bool { return id == 1 },
		Handler: Handler{
			BecameLeader: func(term uint64) { led <- term },
			Stopped:      func() { close(stopped) },
		},
	})
	if err := n.StartRaft([]raft.Peer{{ID: 1}}); err != nil {
		t.Fatal(err)
	}
	stop, ran := make(chan struct{}), make(chan struct{})
	go func() { defer close(ran); n.Run(stop) }()
	defer func() {
		n.Stop()
		close(stop)
		<-ran
		select {
		case <-stopped:
		default:
			t.Error("the Handler did not hear the loop stop")
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case term := <-led:
		if term == 0 || term != n.Term() || !n.IsLeader() || n.Leader() != 1 {
			t.Fatalf("became leader in term %d; node says term %d, leader %d, leading %v", term, n.Term(), n.Leader(), n.IsLeader())
		}
	case <-ctx.Done():
		t.Fatal("the Handler never heard of leadership")
	}
	out, entered, err := w.Propose(ctx, n, func(id uint64) ([]byte, error) {
		return append(binary.BigEndian.AppendUint64(nil, id), "hello"...), nil
	})
	if err != nil || !entered || out.Result != "hello" || out.Index == 0 {
		t.Fatalf("Propose: %+v, entered %v, err %v; want hello applied", out, entered, err)
	}
	if err := n.ConfirmLeadership(ctx); err != nil {
		t.Fatalf("ConfirmLeadership: %v", err)
	}
	if got := app.Applied(); got < out.Index {
		t.Fatalf("applied %d after a linearizable read, below the write at %d", got, out.Index)
	}
	app.mu.Lock()
	data := app.data
	app.mu.Unlock()
	if len(data) != 1 || data[0] != "hello" {
		t.Fatalf("entries applied: %q, want the one proposed", data)
	}
	if w.Waiting() != 0 {
		t.Fatalf("%d proposers left waiting", w.Waiting())
	}
}
