// Package pgfence is a fence adapter for PostgreSQL, over pgx v5.
//
// A fenced write is one transaction: a single conditional upsert checks and
// records the token, then the caller's function runs on the same
// transaction, then it commits. The upsert is
//
//	INSERT INTO <table> (resource, token) VALUES ($1, $2)
//	ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token
//	WHERE <table>.token <= EXCLUDED.token
//
// and its affected-row count decides: one row means the token was accepted
// and recorded, none means it is stale (the highest token is then read for
// the error and the transaction is rolled back).
//
// # Concurrency
//
// The upsert takes the row lock of the resource's token row (a new row is
// guarded by the primary key's unique index) and the transaction keeps it
// until it commits or rolls back. Concurrent fenced writes to one resource
// therefore serialize on that row: under READ COMMITTED, PostgreSQL's default,
// a waiting upsert re-evaluates its WHERE clause against the row as the
// previous writer committed it, so a lower token that waited behind a higher
// one is rejected. The caller's writes happen while the lock is held, so
// they commit in token order too. Under REPEATABLE READ or SERIALIZABLE a
// concurrent update makes the upsert fail with a serialization error
// instead; that is safe, and the caller may retry. Writes to different
// resources do not block each other.
//
// # Schema
//
// The tokens live in a table (DefaultTable unless WithTable says otherwise)
// that must exist before the first write: create it with CreateTable, or put
// Schema's statement into your migrations. Do not write to it yourself.
// Tokens are stored as BIGINT, which is why fence.MaxToken is 2^63-1.
//
// # Caveats
//
// The fence covers exactly the statements run inside the write function on
// the tx it is given. If Commit itself fails (say the connection drops), the
// outcome is unknown, as for any database write; retrying with the same
// token is safe because equal tokens are accepted.
package pgfence

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leased/leased/client/fence"
)

// DefaultTable is the name of the table holding the fencing tokens.
const DefaultTable = "leased_fence_tokens"

// DB is what a Fence needs of a database handle. *pgxpool.Pool and
// *pgx.Conn implement it.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Fence performs fenced writes on one PostgreSQL database. It is safe for
// concurrent use when its DB is (a *pgxpool.Pool is, a *pgx.Conn is not).
type Fence struct {
	db     DB
	table  string // quoted identifier
	upsert string
	query  string
}

// Option configures a Fence.
type Option func(*Fence) error

// WithTable stores the tokens in the named table instead of DefaultTable:
// one part ("fence_tokens") or two ("myschema", "fence_tokens"). The parts
// are quoted as identifiers, so they are used exactly as given.
func WithTable(parts ...string) Option {
	return func(f *Fence) error {
		if len(parts) == 0 || len(parts) > 2 || slices.Contains(parts, "") {
			return fmt.Errorf("invalid table name %q: want [schema,] table", parts)
		}
		f.table = pgx.Identifier(parts).Sanitize()
		return nil
	}
}

// New returns a Fence over db. It does not touch the database; see
// CreateTable.
func New(db DB, opts ...Option) (*Fence, error) {
	f := &Fence{db: db, table: pgx.Identifier{DefaultTable}.Sanitize()}
	for _, opt := range opts {
		if err := opt(f); err != nil {
			return nil, err
		}
	}
	f.upsert = fmt.Sprintf(`INSERT INTO %[1]s AS t (resource, token) VALUES ($1, $2)
ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token
WHERE t.token <= EXCLUDED.token`, f.table)
	f.query = fmt.Sprintf(`SELECT token FROM %s WHERE resource = $1`, f.table)
	return f, nil
}

// Schema returns the statement that creates the token table, for migration
// tools. It is idempotent (CREATE TABLE IF NOT EXISTS).
func (f *Fence) Schema() string {
	return strings.TrimSpace(fmt.Sprintf(`
CREATE TABLE IF NOT EXISTS %s (
	resource text PRIMARY KEY,
	token bigint NOT NULL CHECK (token > 0)
)`, f.table))
}

// CreateTable creates the token table if it does not exist. Run it once,
// before the first write (for example at startup or in a migration); running
// it from many sessions at once can fail on PostgreSQL's catalog races.
func (f *Fence) CreateTable(ctx context.Context) error {
	if _, err := f.db.Exec(ctx, f.Schema()); err != nil {
		return fmt.Errorf("create fence table: %w", err)
	}
	return nil
}

// Write performs a fenced write in one transaction: it checks and records
// token for resource with Check, runs write on the same transaction, and
// commits. If token is stale it returns a *fence.StaleTokenError without
// calling write. If write returns an error, that error is returned and the
// transaction, including the token, is rolled back.
func (f *Fence) Write(ctx context.Context, resource string, token uint64, write func(ctx context.Context, tx pgx.Tx) error) error {
	if err := fence.Validate(resource, token); err != nil {
		return err
	}
	tx, err := f.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin fenced write: %w", err)
	}
	// Rolling back after a commit is a no-op; on every other path it undoes
	// the token and the caller's writes together. (If ctx is done, pgx
	// closes the connection instead, and the server aborts the transaction.)
	defer func() { _ = tx.Rollback(ctx) }()
	if err := f.Check(ctx, tx, resource, token); err != nil {
		return err
	}
	if err := write(ctx, tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit fenced write: %w", err)
	}
	return nil
}

// Claim records token as the highest token of resource without writing any
// data, in one transaction under the same rule as Write: a token lower than
// one already accepted is refused with a *fence.StaleTokenError; an equal one
// is accepted. A new holder claims its token before its first write so that
// an older holder's late write is refused from then on.
func (f *Fence) Claim(ctx context.Context, resource string, token uint64) error {
	return f.Write(ctx, resource, token, func(context.Context, pgx.Tx) error { return nil })
}

// Check is the building block of Write for callers that manage their own
// transaction: it checks token against the highest token recorded for
// resource and records it, with one conditional upsert in tx. If it returns
// an error the caller must roll tx back; if it returns nil, the caller's
// statements in tx are fenced when tx commits (see the package comment for
// the locking this relies on).
func (f *Fence) Check(ctx context.Context, tx pgx.Tx, resource string, token uint64) error {
	if err := fence.Validate(resource, token); err != nil {
		return err
	}
	tag, err := tx.Exec(ctx, f.upsert, resource, int64(token))
	if err != nil {
		return fmt.Errorf("record token of %q: %w", resource, err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	highest, err := highest(ctx, tx, f.query, resource)
	if err != nil {
		return err
	}
	if highest <= token {
		// Only a direct write to the token table can get here.
		return fmt.Errorf("token %d of %q rejected, yet highest is %d: token table changed outside the fence",
			token, resource, highest)
	}
	return fence.Stale(resource, token, highest)
}

// Highest returns the highest token accepted for resource, or 0 if none.
func (f *Fence) Highest(ctx context.Context, resource string) (uint64, error) {
	return highest(ctx, f.db, f.query, resource)
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func highest(ctx context.Context, q querier, query, resource string) (uint64, error) {
	var token int64
	err := q.QueryRow(ctx, query, resource).Scan(&token)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read token of %q: %w", resource, err)
	}
	return uint64(token), nil
}
