package boltfence_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"go.etcd.io/bbolt"

	"github.com/leased/leased/client/fence"
	"github.com/leased/leased/client/fence/boltfence"
)

// A holder writes with the token of its grant inside the fenced transaction;
// a holder whose lease was lost (older token) is rejected and writes nothing.
func ExampleFence_Write() {
	dir, err := os.MkdirTemp("", "boltfence-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := bbolt.Open(filepath.Join(dir, "app.db"), 0o600, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	ctx := context.Background()
	f := boltfence.New(db)
	put := func(token uint64, value string) error {
		return f.Write(ctx, "billing-run", token, func(tx *bbolt.Tx) error {
			b, err := tx.CreateBucketIfNotExists([]byte("app"))
			if err != nil {
				return err
			}
			return b.Put([]byte("last-run"), []byte(value))
		})
	}

	fmt.Println("token 42:", put(42, "run by holder 42"))
	err = put(17, "run by holder 17") // a paused holder with a lost lease
	var stale *fence.StaleTokenError
	if errors.As(err, &stale) {
		fmt.Println("token 17 rejected, highest is", stale.Highest)
	}

	_ = db.View(func(tx *bbolt.Tx) error {
		fmt.Println(string(tx.Bucket([]byte("app")).Get([]byte("last-run"))))
		return nil
	})
	// Output:
	// token 42: <nil>
	// token 17 rejected, highest is 42
	// run by holder 42
}
