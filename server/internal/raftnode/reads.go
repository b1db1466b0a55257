package raftnode

import (
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"time"

	"go.etcd.io/raft/v3"

	"github.com/leased/leased/server/internal/errs"
)

// Linearizable waits until this node's state reflects every write committed before the call (ReadIndex).
func (n *Node) Linearizable(ctx context.Context) error {
	start := time.Now()
	idx, err := n.reads.readIndex(ctx)
	n.metrics.readSeconds.Observe(since(start))
	if err != nil {
		return err
	}
	if err := n.cfg.Applier.WaitApplied(ctx, idx, n.done); err != nil {
		return errors.Join(err, n.StoppedErr())
	}
	return nil
}

// ConfirmLeadership returns nil only if this node was the leader, in the same term, both before and after
// a quorum acknowledged its leadership (decision 4), and its state reflects everything committed before.
func (n *Node) ConfirmLeadership(ctx context.Context) error {
	term := n.term.Load()
	if !n.IsLeader() {
		return n.NotLeaderErr()
	}
	if err := n.Linearizable(ctx); err != nil {
		return err
	}
	if !n.IsLeader() || n.term.Load() != term {
		return n.NotLeaderErr()
	}
	return nil
}

// readIndexer batches ReadIndex requests: every caller waiting when a round starts shares it, so a burst
// of renewals or linearizable reads costs one heartbeat round to a quorum (decisions 4 and 6).
type readIndexer struct {
	raft    *raftHost
	timeout time.Duration
	// halted closes when the node stops serving (Node.Done): a waiting read gives up at once.
	halted <-chan struct{}

	mu      sync.Mutex
	pending []chan readOutcome
	rounds  map[uint64]chan uint64 // round id -> its read state's index
	nextID  uint64
	kick    chan struct{}
}

type readOutcome struct {
	index uint64
	err   error
}

func newReadIndexer(r *raftHost, timeout time.Duration, halted <-chan struct{}) *readIndexer {
	return &readIndexer{raft: r, timeout: timeout, halted: halted, rounds: make(map[uint64]chan uint64), kick: make(chan struct{}, 1)}
}

// readIndex returns a commit index that was current when the call was made, confirmed by a quorum.
func (r *readIndexer) readIndex(ctx context.Context) (uint64, error) {
	ch := make(chan readOutcome, 1)
	r.mu.Lock()
	r.pending = append(r.pending, ch)
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
	select {
	case out := <-ch:
		return out.index, out.err
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-r.halted:
		return 0, errs.ErrStopped
	}
}

// run serves rounds until stop closes. One round at a time: requests that arrive during a round wait
// for the next, which starts as soon as the current one ends.
func (r *readIndexer) run(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			r.failPending(errs.ErrStopped)
			return
		case <-r.kick:
		}
		r.mu.Lock()
		batch := r.pending
		r.pending = nil
		r.mu.Unlock()
		if len(batch) == 0 {
			continue
		}
		idx, err := r.round(stop)
		for _, ch := range batch {
			ch <- readOutcome{index: idx, err: err}
		}
	}
}

func (r *readIndexer) round(stop <-chan struct{}) (uint64, error) {
	r.mu.Lock()
	r.nextID++
	id := r.nextID
	result := make(chan uint64, 1)
	r.rounds[id] = result
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.rounds, id)
		r.mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
	defer cancel()
	var rctx [8]byte
	binary.BigEndian.PutUint64(rctx[:], id)
	if err := r.raft.readIndex(ctx, rctx[:]); err != nil {
		return 0, errs.ErrNoLeader
	}
	select {
	case idx := <-result:
		return idx, nil
	case <-ctx.Done():
		// No quorum answered in time: no leader, or this node is cut off.
		return 0, errs.ErrNoLeader
	case <-stop:
		return 0, errs.ErrStopped
	}
}

// deliver hands a ReadState from the Ready loop to the round waiting for it.
func (r *readIndexer) deliver(rs raft.ReadState) {
	if len(rs.RequestCtx) != 8 {
		return
	}
	id := binary.BigEndian.Uint64(rs.RequestCtx)
	r.mu.Lock()
	ch, ok := r.rounds[id]
	r.mu.Unlock()
	if ok {
		select {
		case ch <- rs.Index:
		default:
		}
	}
}

func (r *readIndexer) failPending(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ch := range r.pending {
		ch <- readOutcome{err: err}
	}
	r.pending = nil
}
