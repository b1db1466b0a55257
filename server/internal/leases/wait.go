package leases

import (
	"context"
	"sync"

	"github.com/leased/leased/server/internal/errs"
)

// IndexWaiter lets goroutines wait until an index (the applied index, say) reaches a value.
type IndexWaiter struct {
	mu      sync.Mutex
	current uint64
	waiters map[uint64][]chan struct{}
}

// NewIndexWaiter starts a waiter at index start.
func NewIndexWaiter(start uint64) *IndexWaiter {
	return &IndexWaiter{current: start, waiters: make(map[uint64][]chan struct{})}
}

// Notify moves the index to index (never back) and wakes those waiting for it or an earlier one.
func (w *IndexWaiter) Notify(index uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if index <= w.current {
		return
	}
	w.current = index
	for i, chs := range w.waiters {
		if i <= index {
			for _, ch := range chs {
				close(ch)
			}
			delete(w.waiters, i)
		}
	}
}

// Wait returns once the index reaches index, or ctx's error, or errs.ErrStopped once stopped closes.
func (w *IndexWaiter) Wait(ctx context.Context, index uint64, stopped <-chan struct{}) error {
	w.mu.Lock()
	if index <= w.current {
		w.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	w.waiters[index] = append(w.waiters[index], ch)
	w.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-stopped:
		return errs.ErrStopped
	}
}
