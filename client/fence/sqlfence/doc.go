// Package sqlfence is a fence adapter for SQL databases through
// database/sql, with any driver: a Dialect says how to speak to PostgreSQL,
// MariaDB (and MySQL) or SQLite.
//
// A fenced write is one transaction on the caller's database, in three
// steps before it commits:
//
//  1. an upsert inserts the resource's token row, or raises its token to the
//     greater of the recorded and the given token (PostgreSQL and SQLite:
//     INSERT ... ON CONFLICT DO UPDATE; MariaDB: INSERT ... ON DUPLICATE KEY
//     UPDATE). It takes the row's write lock, which the transaction keeps
//     until it ends;
//  2. a read of the row (SELECT ... FOR UPDATE where the database has
//     locking reads) decides: if the recorded token is now the given one,
//     the token is accepted; if it is greater, the token is stale, and the
//     transaction is rolled back with a *fence.StaleTokenError;
//  3. the caller's function runs its statements on the same *sql.Tx.
//
// Reading the row back, rather than counting affected rows, keeps the
// decision the same on every driver: MySQL drivers report 0 affected rows
// for an update that changes nothing (an equal token), the same count as a
// refused one, unless the connection sets CLIENT_FOUND_ROWS.
//
// # Concurrency and the first write
//
// Concurrent fenced writes to one resource serialize on its token row: the
// second upsert waits for the first transaction to end and then works on
// the row as it committed, so a lower token that waited behind a higher one
// reads the higher one back and is refused, and the callers' statements
// commit in token order. That holds for the first write of a resource too,
// where there is no row to lock yet: the primary key's unique index makes a
// second insert of the same resource wait for the first transaction, and
// then take the update path (PostgreSQL, InnoDB), and SQLite admits one
// writer to the whole database at a time. Writes to different resources do
// not wait for each other, except on SQLite.
//
// # Isolation
//
// The fence needs a transactional store and nothing above the database's
// default isolation level:
//   - PostgreSQL: READ COMMITTED (the default) or higher. Under REPEATABLE
//     READ and SERIALIZABLE a write that waited behind a concurrent one
//     fails with a serialization error (SQLSTATE 40001) instead; that is
//     safe, and the caller may retry.
//   - MariaDB/MySQL: InnoDB tables, for the token table (Schema says
//     ENGINE=InnoDB) and for every table the caller writes; a
//     non-transactional engine such as MyISAM or Aria cannot roll a refused
//     or failed write back. READ COMMITTED or REPEATABLE READ (the default):
//     the locking read sees the newest committed token whatever the
//     transaction's snapshot. InnoDB may pick a transaction as a deadlock
//     victim (error 1213) when writes lock several rows in different orders;
//     that write is rolled back whole and may be retried.
//   - SQLite: any mode; SQLite transactions are serializable. Begin writing
//     transactions IMMEDIATE (the default of github.com/ncruces/go-sqlite3's
//     driver; "_txlock=immediate" for others) and set a busy timeout, so
//     that concurrent writers wait for the database lock instead of failing
//     with SQLITE_BUSY. A shared-cache or ":memory:" database is private to
//     one connection; use a file.
//
// WithTxOptions chooses the isolation level of the fenced transactions.
//
// # Schema
//
// The tokens live in a table (DefaultTable unless WithTable says
// otherwise) that must exist before the first write: create it with
// CreateTable, or put Schema's statement into your migrations. Do not write
// to it yourself. Tokens are stored as 64-bit signed integers, which is why
// fence.MaxToken is 2^63-1; resource names longer than MaxResourceBytes are
// refused, because MariaDB's key column is that wide.
//
// # Caveats
//
// The fence covers exactly the statements run inside the write function on
// the *sql.Tx it is given; a statement run on the *sql.DB instead is outside
// the transaction and unfenced. If Commit itself fails (say the connection
// drops), the outcome is unknown, as for any database write; retrying with
// the same token is safe because equal tokens are accepted.
package sqlfence
