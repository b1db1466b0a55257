package sqlfence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/leased/leased/client/fence"
)

// DefaultTable is the name of the table holding the fencing tokens.
const DefaultTable = "leased_fence_tokens"

// MaxResourceBytes bounds a resource name: the width of MariaDB's key
// column. It is four times the server's default limit on resource names.
const MaxResourceBytes = 1024

// DB is what a Fence needs of a database handle. *sql.DB and *sql.Conn
// implement it.
type DB interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Fence performs fenced writes on one database. It is safe for concurrent
// use when its DB is (a *sql.DB is, a *sql.Conn is not).
type Fence struct {
	db        DB
	dialect   Dialect
	table     []string
	txOpts    *sql.TxOptions
	upsert    string
	createRow string // "" unless the dialect creates rows before the transaction
	read      string // the recorded token, inside the fenced transaction
	query     string // the recorded token, outside any transaction
}

// Option configures a Fence.
type Option func(*Fence) error

// WithTable stores the tokens in the named table instead of DefaultTable:
// one part ("fence_tokens") or two ("myschema", "fence_tokens"; a database
// on MariaDB, an attached database on SQLite). The parts are quoted as
// identifiers, so they are used exactly as given.
func WithTable(parts ...string) Option {
	return func(f *Fence) error {
		if len(parts) == 0 || len(parts) > 2 || slices.Contains(parts, "") {
			return fmt.Errorf("invalid table name %q: want [schema,] table", parts)
		}
		f.table = parts
		return nil
	}
}

// WithTxOptions begins every fenced transaction with opts (isolation level;
// ReadOnly is refused). See the package comment for the levels each
// database needs.
func WithTxOptions(opts sql.TxOptions) Option {
	return func(f *Fence) error {
		if opts.ReadOnly {
			return errors.New("fenced transactions write: TxOptions.ReadOnly is not allowed")
		}
		f.txOpts = &opts
		return nil
	}
}

// New returns a Fence over db speaking dialect. It does not touch the
// database; see CreateTable.
func New(db DB, dialect Dialect, opts ...Option) (*Fence, error) {
	if dialect.name == "" {
		return nil, errors.New("sqlfence: no dialect (use sqlfence.PostgreSQL, MariaDB or SQLite)")
	}
	f := &Fence{db: db, dialect: dialect, table: []string{DefaultTable}}
	for _, opt := range opts {
		if err := opt(f); err != nil {
			return nil, err
		}
	}
	table, p := f.Table(), dialect.placeholder
	f.upsert = fmt.Sprintf(dialect.upsert, table, p(1), p(2))
	if dialect.createRow != "" {
		f.createRow = fmt.Sprintf(dialect.createRow, table, p(1))
	}
	f.query = fmt.Sprintf(`SELECT token FROM %s WHERE resource = %s`, table, p(1))
	f.read = f.query + dialect.lockedRead
	return f, nil
}

// Table returns the quoted name of the token table.
func (f *Fence) Table() string {
	quoted := make([]string, len(f.table))
	for i, part := range f.table {
		quoted[i] = f.dialect.quote(part)
	}
	return strings.Join(quoted, ".")
}

// Schema returns the statement that creates the token table, for migration
// tools. It is idempotent (CREATE TABLE IF NOT EXISTS).
func (f *Fence) Schema() string {
	return fmt.Sprintf(f.dialect.schema, f.Table())
}

// CreateTable creates the token table if it does not exist. Run it once,
// before the first write (at startup or in a migration).
func (f *Fence) CreateTable(ctx context.Context) error {
	if _, err := f.db.ExecContext(ctx, f.Schema()); err != nil {
		return fmt.Errorf("create fence table: %w", err)
	}
	return nil
}

// Write performs a fenced write in one transaction: it checks and records
// token for resource with Check, runs write on the same transaction, and
// commits. If token is stale it returns a *fence.StaleTokenError without
// calling write. If write returns an error, that error is returned and the
// transaction, including the token, is rolled back.
func (f *Fence) Write(ctx context.Context, resource string, token uint64, write func(ctx context.Context, tx *sql.Tx) error) error {
	if err := validate(resource, token); err != nil {
		return err
	}
	if err := f.ensureRow(ctx, resource); err != nil {
		return err
	}
	tx, err := f.db.BeginTx(ctx, f.txOpts)
	if err != nil {
		return fmt.Errorf("begin fenced write: %w", err)
	}
	// Rolling back after a commit is a no-op (sql.ErrTxDone); on every other
	// path it undoes the token and the caller's statements together.
	defer func() { _ = tx.Rollback() }()
	if err := f.check(ctx, tx, resource, token); err != nil {
		return err
	}
	if err := write(ctx, tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
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
	return f.Write(ctx, resource, token, func(context.Context, *sql.Tx) error { return nil })
}

// Check is the building block of Write for callers that manage their own
// transaction: it records token for resource unless a greater one is
// recorded, and reads the row back to decide, in tx. If it returns an error
// the caller must roll tx back; if it returns nil, the caller's statements
// in tx are fenced when tx commits (see the package comment for the
// locking this relies on). Call it before the fenced statements, early in
// tx, so that the row lock is held while they run.
//
// With the MariaDB dialect, Check first creates the resource's token row
// through the Fence's DB, outside tx (see MariaDB): give New a *sql.DB, not
// the *sql.Conn that tx belongs to, which would wait for tx forever.
func (f *Fence) Check(ctx context.Context, tx *sql.Tx, resource string, token uint64) error {
	if err := validate(resource, token); err != nil {
		return err
	}
	if err := f.ensureRow(ctx, resource); err != nil {
		return err
	}
	return f.check(ctx, tx, resource, token)
}

// ensureRow creates the token row of resource, outside any transaction,
// where the dialect needs it to exist before the fenced transaction.
func (f *Fence) ensureRow(ctx context.Context, resource string) error {
	if f.createRow == "" {
		return nil
	}
	if _, err := f.db.ExecContext(ctx, f.createRow, resource); err != nil {
		return fmt.Errorf("create token row of %q: %w", resource, err)
	}
	return nil
}

func (f *Fence) check(ctx context.Context, tx *sql.Tx, resource string, token uint64) error {
	if _, err := tx.ExecContext(ctx, f.upsert, resource, int64(token)); err != nil {
		return fmt.Errorf("record token of %q: %w", resource, err)
	}
	recorded, err := readToken(tx.QueryRowContext(ctx, f.read, resource))
	switch {
	case err != nil:
		return fmt.Errorf("read token of %q: %w", resource, err)
	case recorded < token:
		// The upsert left at least token; only a direct write to the token
		// table, or an isolation level that hides our own write, gets here.
		return fmt.Errorf("token %d of %q recorded, yet the table holds %d: token table changed outside the fence",
			token, resource, recorded)
	}
	return fence.Check(resource, token, recorded)
}

// Highest returns the highest token accepted for resource, or 0 if none.
func (f *Fence) Highest(ctx context.Context, resource string) (uint64, error) {
	token, err := readToken(f.db.QueryRowContext(ctx, f.query, resource))
	if err != nil {
		return 0, fmt.Errorf("read token of %q: %w", resource, err)
	}
	return token, nil
}

// readToken scans a token row: 0 when there is none (or, on MariaDB, when
// its token is 0: created, no token accepted yet).
func readToken(row *sql.Row) (uint64, error) {
	var token int64
	err := row.Scan(&token)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return 0, nil
	case err != nil:
		return 0, err
	case token < 0:
		return 0, fmt.Errorf("corrupt token %d", token)
	}
	return uint64(token), nil
}

// validate adds this adapter's bound on resource names to fence.Validate.
func validate(resource string, token uint64) error {
	if err := fence.Validate(resource, token); err != nil {
		return err
	}
	if len(resource) > MaxResourceBytes {
		return fmt.Errorf("%w: %d bytes, sqlfence's limit is %d", fence.ErrInvalidResource, len(resource), MaxResourceBytes)
	}
	return nil
}
