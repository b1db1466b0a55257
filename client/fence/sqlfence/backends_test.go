package sqlfence_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"       // database/sql driver "mysql"
	_ "github.com/jackc/pgx/v5/stdlib"       // database/sql driver "pgx"
	_ "github.com/ncruces/go-sqlite3/driver" // database/sql driver "sqlite3"

	"github.com/leased/leased/client/fence/sqlfence"
	"github.com/leased/leased/client/internal/servicetest"
)

const (
	postgresEnv = "LEASED_TEST_POSTGRES_DSN"
	mariadbEnv  = "LEASED_TEST_MARIADB_DSN"
)

// tableSeq and runID make table names unique per test and per run, so runs
// against a shared server do not collide.
var (
	tableSeq atomic.Int64
	runID    = time.Now().UnixNano() % 1e9
)

// backend is one database the suite runs on, through its database/sql
// driver.
type backend struct {
	name    string
	dialect sqlfence.Dialect
	// dataSource returns the DSN of an isolated database for t (skipping t
	// when the server is not configured), and the driver name.
	dataSource func(t *testing.T) (driver, dsn string)
	// historyDDL creates the harness's history table (%s). Its seq column
	// numbers the rows in insertion order, which for one resource is the
	// order in which the fence accepted the writes (they insert while
	// holding the token row's lock).
	historyDDL string
	// lockWaiters counts the sessions waiting on a lock; nil where the
	// database cannot tell (SQLite).
	lockWaiters func(ctx context.Context, db *sql.DB) (int, error)
}

var backends = []backend{
	{
		name:    "SQLite",
		dialect: sqlfence.SQLite,
		dataSource: func(t *testing.T) (string, string) {
			// A file (":memory:" is private to one connection), WAL so that
			// readers do not wait for the writer, immediate transactions and
			// a busy timeout so that writers queue for the database lock.
			path := filepath.Join(t.TempDir(), "fence.db")
			q := url.Values{"_txlock": {"immediate"}, "_pragma": {"busy_timeout(60000)", "journal_mode(wal)"}}
			return "sqlite3", "file:" + path + "?" + q.Encode()
		},
		historyDDL: `CREATE TABLE %s (seq INTEGER PRIMARY KEY AUTOINCREMENT, resource TEXT NOT NULL, value TEXT NOT NULL)`,
	},
	{
		name:    "MariaDB",
		dialect: sqlfence.MariaDB,
		dataSource: func(t *testing.T) (string, string) {
			return "mysql", servicetest.Require(t, mariadbEnv, "MariaDB")
		},
		historyDDL: `CREATE TABLE %s (seq BIGINT AUTO_INCREMENT PRIMARY KEY,
			resource VARBINARY(1024) NOT NULL, value VARCHAR(255) NOT NULL) ENGINE=InnoDB`,
		lockWaiters: func(ctx context.Context, db *sql.DB) (int, error) {
			var n int
			err := db.QueryRowContext(ctx,
				`SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT'`).Scan(&n)
			return n, err
		},
	},
	{
		name:    "PostgreSQL",
		dialect: sqlfence.PostgreSQL,
		dataSource: func(t *testing.T) (string, string) {
			return "pgx", servicetest.Require(t, postgresEnv, "PostgreSQL")
		},
		historyDDL: `CREATE TABLE %s (seq bigserial PRIMARY KEY, resource text NOT NULL, value text NOT NULL)`,
		lockWaiters: func(ctx context.Context, db *sql.DB) (int, error) {
			var n int
			err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&n)
			return n, err
		},
	},
}

// store is one test's isolated pair of tables on a backend.
type store struct {
	backend
	driver, dsn string
	tokens      string // token table name
	history     string // history table name
}

// newStore opens the backend for t, creates a fresh token table and
// history table, and drops them when t ends. The *sql.DB it returns is
// closed when t ends.
func newStore(t *testing.T, b backend) (*store, *sql.DB) {
	t.Helper()
	driver, dsn := b.dataSource(t)
	s := &store{backend: b, driver: driver, dsn: dsn}
	name := fmt.Sprintf("fencetest_%d_%d", runID, tableSeq.Add(1))
	s.tokens, s.history = name+"_tokens", name+"_history"
	db := s.open(t)
	f := s.fence(t, db)
	ctx := t.Context()
	if err := f.CreateTable(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, fmt.Sprintf(b.historyDDL, s.history)); err != nil {
		t.Fatalf("create history table: %v", err)
	}
	t.Cleanup(func() {
		for _, table := range []string{s.tokens, s.history} {
			_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+table)
		}
	})
	return s, db
}

// open opens a new connection pool on the store's database; t closes it.
func (s *store) open(t *testing.T) *sql.DB {
	t.Helper()
	db, err := s.connect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func (s *store) connect(ctx context.Context) (*sql.DB, error) {
	db, err := sql.Open(s.driver, s.dsn)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", s.name, err)
	}
	db.SetMaxOpenConns(16)
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("connect to %s: %w", s.name, err)
	}
	return db, nil
}

func (s *store) fence(t *testing.T, db *sql.DB) *sqlfence.Fence {
	t.Helper()
	f, err := sqlfence.New(db, s.dialect, sqlfence.WithTable(s.tokens))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// placeholders rewrites "?" placeholders for the backend's dialect.
func (s *store) placeholders(query string) string {
	if s.dialect.String() != sqlfence.PostgreSQL.String() {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}
