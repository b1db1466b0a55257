package chaos

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leased/leased/client/fence/pgfence"
)

// pgStore is a second fenced store, in PostgreSQL (another process, with its own transactions), used when
// LEASED_TEST_POSTGRES_DSN is set (scripts/services.sh sets it). Every accepted write appends a row in the
// same transaction as the fence check; the rows' ids give the commit order per resource (writers of one
// resource serialise on the fence row's lock).
type pgStore struct {
	pool  *pgxpool.Pool
	fence *pgfence.Fence
	table string
}

func newPGStore(t testing.TB) *pgStore {
	dsn := os.Getenv("LEASED_TEST_POSTGRES_DSN")
	if dsn == "" {
		t.Log("LEASED_TEST_POSTGRES_DSN not set: the workload writes through the memory fence only")
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatalf("postgres: %v", err)
	}
	suffix := fmt.Sprintf("%d", time.Now().UnixNano())
	s := &pgStore{pool: pool, table: "chaos_writes_" + suffix}
	if s.fence, err = pgfence.New(pool, pgfence.WithTable("chaos_fence_"+suffix)); err != nil {
		t.Fatal(err)
	}
	if err := s.fence.CreateTable(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, fmt.Sprintf("CREATE TABLE %s (id bigserial PRIMARY KEY, resource text, token bigint, value text)", s.table)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return s
}

// write appends (resource, token, value) through the fence; it reports whether PostgreSQL accepted it.
func (s *pgStore) write(ctx context.Context, resource string, token uint64, value string) error {
	return s.fence.Write(ctx, resource, token, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, fmt.Sprintf("INSERT INTO %s (resource, token, value) VALUES ($1, $2, $3)", s.table), resource, int64(token), value)
		return err
	})
}

// log returns the accepted writes in commit order per resource, and each resource's final value.
func (s *pgStore) log(ctx context.Context) ([]write, map[string]string, error) {
	rows, err := s.pool.Query(ctx, fmt.Sprintf("SELECT resource, token, value FROM %s ORDER BY id", s.table))
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	var log []write
	final := map[string]string{}
	for rows.Next() {
		var w write
		var tok int64
		if err := rows.Scan(&w.Resource, &tok, &w.Value); err != nil {
			return nil, nil, err
		}
		w.Token = uint64(tok)
		log = append(log, w)
		final[w.Resource] = w.Value // the last row of a resource is its stored value
	}
	return log, final, rows.Err()
}
