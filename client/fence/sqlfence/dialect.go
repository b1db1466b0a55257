package sqlfence

import (
	"fmt"
	"strings"
)

// Dialect is the SQL a Fence speaks to one kind of database: how it writes
// placeholders and quotes identifiers, its upsert, whether it has locking
// reads, and the token table's schema. The dialects are PostgreSQL, MariaDB
// (also for MySQL) and SQLite; the zero Dialect is not usable.
type Dialect struct {
	name        string
	placeholder func(i int) string     // the i-th (1-based) parameter
	quote       func(id string) string // one identifier part, quoted
	// upsert inserts the token row or raises its token to the greater of
	// the two; %[1]s is the table, %[2]s and %[3]s the resource and token
	// parameters. It takes the row's write lock until the transaction ends.
	upsert string
	// lockedRead ends the read of the recorded token inside the fenced
	// transaction: " FOR UPDATE" where the database has locking reads (they
	// read the newest committed row, not the transaction's snapshot), empty
	// for SQLite, which locks the whole database for a writer.
	lockedRead string
	// createRow, where not empty, inserts the resource's token row with
	// token 0 ("none yet") unless it exists, in a statement of its own
	// before the fenced transaction; %[1]s is the table, %[2]s the resource
	// parameter. See MariaDB for why.
	createRow string
	// schema creates the token table; %s is the table.
	schema string
}

// PostgreSQL is the dialect of PostgreSQL, for drivers such as pgx's
// database/sql driver (github.com/jackc/pgx/v5/stdlib). For pgx's own
// interface, package pgfence needs no database/sql.
var PostgreSQL = Dialect{
	name:        "postgresql",
	placeholder: func(i int) string { return fmt.Sprintf("$%d", i) },
	quote:       doubleQuote,
	upsert: `INSERT INTO %[1]s AS t (resource, token) VALUES (%[2]s, %[3]s)
ON CONFLICT (resource) DO UPDATE SET token = GREATEST(t.token, EXCLUDED.token)`,
	lockedRead: " FOR UPDATE",
	schema: `CREATE TABLE IF NOT EXISTS %s (
	resource text PRIMARY KEY,
	token bigint NOT NULL CHECK (token > 0)
)`,
}

// MariaDB is the dialect of MariaDB and MySQL with InnoDB tables, for
// github.com/go-sql-driver/mysql. The resource column is VARBINARY, so
// names compare byte for byte (no case folding, no trailing-space padding,
// whatever the server's default collation).
//
// InnoDB deadlocks when several transactions wait to insert the same new
// key and the one that inserted it first rolls back: the waiters are each
// granted a lock on the gap the row leaves and then block each other's
// insert. So the first write of a resource never inserts its token row
// inside the fenced transaction: a statement of its own, committed at once
// (autocommit), creates the row with token 0 ("no token yet") if it is
// missing, and the fenced transaction only ever locks an existing row.
// That costs one more statement per fenced write. A row with token 0 is
// what a first write that failed or was refused leaves behind; it reads as
// no token. The statement relies on the session's autocommit, MariaDB's
// default: do not set autocommit=0 on the connections of the Fence's DB.
var MariaDB = Dialect{
	name:        "mariadb",
	placeholder: func(int) string { return "?" },
	quote:       backquote,
	upsert: `INSERT INTO %[1]s (resource, token) VALUES (%[2]s, %[3]s)
ON DUPLICATE KEY UPDATE token = GREATEST(token, VALUES(token))`,
	lockedRead: " FOR UPDATE",
	createRow: `INSERT INTO %[1]s (resource, token) VALUES (%[2]s, 0)
ON DUPLICATE KEY UPDATE resource = resource`,
	schema: fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %%s (
	resource VARBINARY(%d) NOT NULL PRIMARY KEY,
	token BIGINT NOT NULL CHECK (token >= 0)
) ENGINE=InnoDB`, MaxResourceBytes),
}

// SQLite is the dialect of SQLite 3.24 or later (for its upsert), for
// drivers such as github.com/ncruces/go-sqlite3/driver.
var SQLite = Dialect{
	name:        "sqlite",
	placeholder: func(int) string { return "?" },
	quote:       doubleQuote,
	upsert: `INSERT INTO %[1]s (resource, token) VALUES (%[2]s, %[3]s)
ON CONFLICT (resource) DO UPDATE SET token = max(token, excluded.token)`,
	lockedRead: "",
	schema: `CREATE TABLE IF NOT EXISTS %s (
	resource TEXT NOT NULL PRIMARY KEY,
	token INTEGER NOT NULL CHECK (token > 0)
) WITHOUT ROWID`,
}

// String returns the dialect's name.
func (d Dialect) String() string { return d.name }

func doubleQuote(id string) string { return `"` + strings.ReplaceAll(id, `"`, `""`) + `"` }

func backquote(id string) string { return "`" + strings.ReplaceAll(id, "`", "``") + "`" }
