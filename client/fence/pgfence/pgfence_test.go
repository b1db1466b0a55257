package pgfence_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/leased/leased/client/fence"
	"github.com/leased/leased/client/fence/fencetest"
	"github.com/leased/leased/client/fence/pgfence"
	"github.com/leased/leased/client/internal/servicetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const dsnEnv = "LEASED_TEST_POSTGRES_DSN"

// tableSeq and runID make table names unique per test and per run, so runs
// against a shared server do not collide.
var (
	tableSeq atomic.Int64
	runID    = time.Now().UnixNano() % 1e9
)

func newPool(ctx context.Context, t testing.TB, dsn string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("parse %s: %v", dsnEnv, err)
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect to PostgreSQL: %v", err)
	}
	return pool
}

// newFence returns a fence over a fresh token table and its pool; both are
// cleaned up when the test ends.
func newFence(t *testing.T) (*pgfence.Fence, *pgxpool.Pool, string) {
	t.Helper()
	dsn := servicetest.Require(t, dsnEnv, "PostgreSQL")
	ctx := t.Context()
	pool := newPool(ctx, t, dsn)
	name := fmt.Sprintf("fencetest_%d_%d", runID, tableSeq.Add(1))
	f, err := pgfence.New(pool, pgfence.WithTable("public", name+"_tokens"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.CreateTable(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(),
			fmt.Sprintf("DROP TABLE IF EXISTS %s_tokens, %s_history", name, name))
		pool.Close()
	})
	return f, pool, name
}

func TestConformance(t *testing.T) {
	servicetest.Require(t, dsnEnv, "PostgreSQL") // skip once, not once per case
	fencetest.Run(t, newHarness)
}

// harness appends to a history table (resource, seq, value) in the fenced
// transaction. Reopen closes the pool and connects again.
type harness struct {
	dsn, name string
	mu        sync.RWMutex
	pool      *pgxpool.Pool
	fence     *pgfence.Fence
}

func newHarness(t *testing.T) fencetest.Harness {
	f, pool, name := newFence(t)
	_, err := pool.Exec(t.Context(), fmt.Sprintf(
		`CREATE TABLE %s_history (resource text NOT NULL, seq bigserial PRIMARY KEY, value text NOT NULL)`, name))
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{dsn: servicetest.Require(t, dsnEnv, "PostgreSQL"), name: name, pool: pool, fence: f}
	t.Cleanup(func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.pool != pool {
			h.pool.Close()
		}
	})
	return h
}

func (h *harness) Reopen(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pool.Close()
	pool, err := pgxpool.New(ctx, h.dsn)
	if err != nil {
		return err
	}
	f, err := pgfence.New(pool, pgfence.WithTable("public", h.name+"_tokens"))
	if err != nil {
		pool.Close()
		return err
	}
	h.pool, h.fence = pool, f
	return nil
}

func (h *harness) insert(ctx context.Context, tx pgx.Tx, resource, value string) error {
	_, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s_history (resource, value) VALUES ($1, $2)`, h.name),
		resource, value)
	return err
}

func (h *harness) Append(ctx context.Context, resource string, token uint64, value string) error {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.fence.Write(ctx, resource, token, func(ctx context.Context, tx pgx.Tx) error {
		return h.insert(ctx, tx, resource, value)
	})
}

func (h *harness) AppendThenFail(ctx context.Context, resource string, token uint64, value string, failure error) error {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.fence.Write(ctx, resource, token, func(ctx context.Context, tx pgx.Tx) error {
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
	rows, err := h.pool.Query(ctx,
		fmt.Sprintf(`SELECT value FROM %s_history WHERE resource = $1 ORDER BY seq`, h.name), resource)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

func (h *harness) Highest(ctx context.Context, resource string) (uint64, error) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.fence.Highest(ctx, resource)
}

// TestConcurrentWritersSerializeOnTheTokenRow holds a fenced transaction open
// and shows that a concurrent lower token waits for it and is then rejected,
// and a concurrent higher token waits and is then accepted.
func TestConcurrentWritersSerializeOnTheTokenRow(t *testing.T) {
	f, pool, _ := newFence(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	noop := func(context.Context, pgx.Tx) error { return nil }
	if err := f.Write(ctx, "r", 3, noop); err != nil {
		t.Fatal(err)
	}

	inside, release := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		first <- f.Write(ctx, "r", 5, func(context.Context, pgx.Tx) error {
			close(inside)
			<-release
			return nil
		})
	}()
	<-inside
	lower, higher := make(chan error, 1), make(chan error, 1)
	go func() { lower <- f.Write(ctx, "r", 4, noop) }()
	go func() { higher <- f.Write(ctx, "r", 6, noop) }()
	waitForLockWaiters(ctx, t, pool, 2)
	close(release)

	if err := <-first; err != nil {
		t.Fatalf("token 5: %v", err)
	}
	var stale *fence.StaleTokenError
	if err := <-lower; !errors.As(err, &stale) || stale.Highest < 5 {
		t.Errorf("token 4 after 5 committed = %v, want stale with highest >= 5", err)
	}
	if err := <-higher; err != nil {
		t.Errorf("token 6 after 5 committed = %v, want accepted", err)
	}
	if got, err := f.Highest(ctx, "r"); err != nil || got != 6 {
		t.Errorf("Highest = %d, %v; want 6", got, err)
	}
}

// waitForLockWaiters polls until n other sessions wait on a lock, or fails
// at the context's deadline.
func waitForLockWaiters(ctx context.Context, t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		var waiting int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&waiting)
		if err != nil {
			t.Fatalf("poll lock waiters: %v", err)
		}
		if waiting >= n {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d sessions waiting on locks, want %d: %v", waiting, n, ctx.Err())
		case <-tick.C:
		}
	}
}

func TestCallerSQLErrorRollsBack(t *testing.T) {
	f, _, _ := newFence(t)
	ctx := t.Context()
	err := f.Write(ctx, "r", 7, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `SELECT * FROM no_such_table`)
		return err
	})
	if err == nil {
		t.Fatal("write with a failing statement succeeded")
	}
	if got, err := f.Highest(ctx, "r"); err != nil || got != 0 {
		t.Errorf("Highest = %d, %v; want 0 (token rolled back)", got, err)
	}
	// A caller that swallows the statement's error cannot commit either: the
	// transaction is aborted.
	err = f.Write(ctx, "r", 7, func(ctx context.Context, tx pgx.Tx) error {
		_, _ = tx.Exec(ctx, `SELECT * FROM no_such_table`)
		return nil
	})
	if err == nil {
		t.Fatal("write whose statement failed silently committed")
	}
	if got, err := f.Highest(ctx, "r"); err != nil || got != 0 {
		t.Errorf("Highest = %d, %v; want 0 (token rolled back)", got, err)
	}
}

func TestWithTableValidation(t *testing.T) {
	for _, parts := range [][]string{nil, {""}, {"a", "b", "c"}, {"s", ""}} {
		if _, err := pgfence.New(nil, pgfence.WithTable(parts...)); err == nil {
			t.Errorf("WithTable(%q) accepted", parts)
		}
	}
	f, err := pgfence.New(nil, pgfence.WithTable(`we"ird`))
	if err != nil {
		t.Fatal(err)
	}
	if want := `CREATE TABLE IF NOT EXISTS "we""ird"`; len(f.Schema()) < len(want) || f.Schema()[:len(want)] != want {
		t.Errorf("Schema() = %q, want prefix %q", f.Schema(), want)
	}
}
