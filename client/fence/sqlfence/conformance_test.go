package sqlfence_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"

	"github.com/leased/leased/client/fence/fencetest"
	"github.com/leased/leased/client/fence/sqlfence"
)

// TestConformance runs the fencetest suite on every backend: SQLite always,
// MariaDB and PostgreSQL when scripts/services.sh (or the developer) has
// set their DSNs.
func TestConformance(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			b.dataSource(t) // skip once, not once per case
			fencetest.Run(t, func(t *testing.T) fencetest.Harness { return newHarness(t, b) })
		})
	}
}

// harness appends to the store's history table in the fenced transaction.
// Reopen closes the connection pool and opens a new one, as a restart of
// the writer's process would.
type harness struct {
	store *store
	mu    sync.RWMutex
	db    *sql.DB
	fence *sqlfence.Fence
}

func newHarness(t *testing.T, b backend) fencetest.Harness {
	s, db := newStore(t, b)
	h := &harness{store: s, db: db, fence: s.fence(t, db)}
	t.Cleanup(func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.db != db {
			_ = h.db.Close()
		}
	})
	return h
}

func (h *harness) Reopen(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.db.Close(); err != nil {
		return err
	}
	db, err := h.store.connect(ctx)
	if err != nil {
		return err
	}
	f, err := sqlfence.New(db, h.store.dialect, sqlfence.WithTable(h.store.tokens))
	if err != nil {
		_ = db.Close()
		return err
	}
	h.db, h.fence = db, f
	return nil
}

func (h *harness) insert(ctx context.Context, tx *sql.Tx, resource, value string) error {
	_, err := tx.ExecContext(ctx,
		h.store.placeholders(fmt.Sprintf(`INSERT INTO %s (resource, value) VALUES (?, ?)`, h.store.history)),
		resource, value)
	return err
}

func (h *harness) Append(ctx context.Context, resource string, token uint64, value string) error {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.fence.Write(ctx, resource, token, func(ctx context.Context, tx *sql.Tx) error {
		return h.insert(ctx, tx, resource, value)
	})
}

func (h *harness) AppendThenFail(ctx context.Context, resource string, token uint64, value string, failure error) error {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.fence.Write(ctx, resource, token, func(ctx context.Context, tx *sql.Tx) error {
		if err := h.insert(ctx, tx, resource, value); err != nil {
			return err
		}
		return failure
	})
}

func (h *harness) Claim(ctx context.Context, resource string, token uint64) error {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.fence.Claim(ctx, resource, token)
}

func (h *harness) History(ctx context.Context, resource string) ([]string, error) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return history(ctx, h.store, h.db, resource)
}

func (h *harness) Highest(ctx context.Context, resource string) (uint64, error) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.fence.Highest(ctx, resource)
}

// history reads the values appended to resource, in acceptance order.
func history(ctx context.Context, s *store, db *sql.DB, resource string) ([]string, error) {
	rows, err := db.QueryContext(ctx,
		s.placeholders(fmt.Sprintf(`SELECT value FROM %s WHERE resource = ? ORDER BY seq`, s.history)), resource)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var values []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		values = append(values, v)
	}
	return values, rows.Err()
}
