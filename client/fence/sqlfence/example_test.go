package sqlfence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	_ "github.com/ncruces/go-sqlite3/driver"

	"github.com/leased/leased/client/fence"
	"github.com/leased/leased/client/fence/sqlfence"
)

// A holder writes with the token of its grant inside the fenced
// transaction; a holder whose lease was lost (older token) is rejected and
// writes nothing. The same code runs on MariaDB (sqlfence.MariaDB, driver
// "mysql") and PostgreSQL (sqlfence.PostgreSQL, driver "pgx", with $1
// placeholders in your statements).
func ExampleFence_Write() {
	dir, err := os.MkdirTemp("", "sqlfence-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(dir, "app.db")+"?_txlock=immediate")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	ctx := context.Background()
	f, err := sqlfence.New(db, sqlfence.SQLite) // sqlfence.MariaDB with driver "mysql", sqlfence.PostgreSQL with "pgx"
	if err != nil {
		log.Fatal(err)
	}
	if err := f.CreateTable(ctx); err != nil { // or put f.Schema() into your migrations
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE runs (name TEXT PRIMARY KEY, by TEXT)`); err != nil {
		log.Fatal(err)
	}
	put := func(token uint64, by string) error {
		return f.Write(ctx, "billing-run", token, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx,
				`INSERT INTO runs (name, by) VALUES ('last', ?) ON CONFLICT (name) DO UPDATE SET by = excluded.by`, by)
			return err
		})
	}

	fmt.Println("token 42:", put(42, "holder 42"))
	err = put(17, "holder 17") // a paused holder with a lost lease
	var stale *fence.StaleTokenError
	if errors.As(err, &stale) {
		fmt.Println("token 17 rejected, highest is", stale.Highest)
	}

	var by string
	if err := db.QueryRowContext(ctx, `SELECT by FROM runs WHERE name = 'last'`).Scan(&by); err != nil {
		log.Fatal(err)
	}
	fmt.Println("last run by", by)
	// Output:
	// token 42: <nil>
	// token 17 rejected, highest is 42
	// last run by holder 42
}
