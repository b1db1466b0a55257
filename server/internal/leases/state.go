package leases

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/leased/leased/fsm"
)

// State owns the node's state machine. The Ready loop is its only writer (Apply, ApplyMembers, Replace);
// any goroutine reads it through Read, and the applied index and size without a lock.
type State struct {
	cfg Config

	// mu guards sm: the Ready loop writes under it, reads take it shared.
	mu sync.RWMutex
	sm *fsm.FSM

	applied     atomic.Uint64
	appliedWait *IndexWaiter
	size        stateSize // live leases and state bytes, for --max-leases and --quota-bytes
}

// Limits are the limits AdmitGrant enforces (server.Limits' fields of the same names).
type Limits struct {
	QuotaBytes            int64
	MaxLeases             int
	QuotaBytesPerIdentity int64
}

// Lessor is what the lessor hears of the state (internal/lessor's Lessor).
type Lessor interface {
	Applied(now time.Time, res fsm.Result)
	Reset(sm *fsm.FSM, now time.Time)
}

// Watch is what the watch streams hear of the state (internal/watch's Hub).
type Watch interface {
	Publish(index uint64, events []fsm.Event)
	Reset(oldest uint64)
}

// Queue is what the blocking acquires hear of the state (internal/waitq's Queue).
type Queue interface {
	Applied(res fsm.Result)
}

// Config is what a State needs of the node: its limits and clock, and whoever hears of what an applied
// entry changed. Every field must be set.
type Config struct {
	Limits Limits
	Now    func() time.Time // the node's clock, for the lessor
	Lessor Lessor
	Watch  Watch
	Queue  Queue
	// Metrics hears of every applied command's result.
	Metrics func(res fsm.Result)
	// Audit hears of every applied command's result, and of a new leader's empty entry (an empty result).
	Audit func(index uint64, res fsm.Result)
	// Answer hands an applied command's result to the proposer waiting for it by its proposal id.
	Answer func(proposalID, index uint64, res fsm.Result)
	// ConfChange applies a conf-change entry: to raft, to the member table (ApplyMembers), to the
	// transport. An error stops the Ready loop.
	ConfChange func(e *raftpb.Entry) error
}

// New returns the owner of sm, whose entries up to applied are in it (a snapshot's, or 0).
func New(sm *fsm.FSM, applied uint64, cfg Config) *State {
	s := &State{cfg: cfg, sm: sm, appliedWait: NewIndexWaiter(applied)}
	s.applied.Store(applied)
	s.size.reset(sm)
	return s
}

// Read runs fn with the state machine locked for reading.
func (s *State) Read(fn func(sm *fsm.FSM)) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	fn(s.sm)
}

// View takes a view of the state machine (fsm.View) to encode outside the lock: the apply waits a
// moment, not for the encoding. The caller releases it.
func (s *State) View() *fsm.View {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sm.View()
}

// Applied is the index of the last entry applied.
func (s *State) Applied() uint64 { return s.applied.Load() }

// WaitApplied returns once the entry at index is applied, or ctx's error, or errs.ErrStopped once stopped
// closes.
func (s *State) WaitApplied(ctx context.Context, index uint64, stopped <-chan struct{}) error {
	return s.appliedWait.Wait(ctx, index, stopped)
}

// ApplyMembers applies a conf-change entry's changes to the member table (Config.ConfChange's part).
func (s *State) ApplyMembers(index uint64, changes []fsm.MemberChange) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sm.ApplyMembers(index, changes)
}

// Replace puts sm, decoded from a snapshot received from the leader, in place of the state machine.
// Restored then tells the listeners; in between, the node reads the new member table.
func (s *State) Replace(sm *fsm.FSM) {
	s.mu.Lock()
	s.sm = sm
	s.mu.Unlock()
}

// Restored moves the applied index to the snapshot's, index, and starts the lessor, the size and the
// watch history over from the state Replace put in place.
func (s *State) Restored(index uint64) {
	s.applied.Store(index)
	s.cfg.Lessor.Reset(s.sm, s.cfg.Now()) // the Ready loop is the only writer: no lock to read
	s.size.reset(s.sm)
	s.cfg.Watch.Reset(index + 1)
	s.appliedWait.Notify(index)
}
