package memfence_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/leased/leased/client/fence"
	"github.com/leased/leased/client/fence/memfence"
)

// A holder writes with the token of its grant; a holder whose lease was lost
// (and so carries an older token) is rejected and writes nothing.
func ExampleStore_Write() {
	ctx := context.Background()
	store := memfence.New()

	// The current holder's grant has token 42.
	err := store.Write(ctx, "report-job", 42, func(tx *memfence.Tx) error {
		tx.Put("report", []byte("written by holder 42"))
		return nil
	})
	fmt.Println("token 42:", err)

	// A paused old holder wakes up with token 17 and tries to write.
	err = store.Write(ctx, "report-job", 17, func(tx *memfence.Tx) error {
		tx.Put("report", []byte("written by holder 17"))
		return nil
	})
	var stale *fence.StaleTokenError
	if errors.As(err, &stale) {
		fmt.Println("token 17 rejected, highest is", stale.Highest)
	}

	report, _ := store.Get("report")
	fmt.Println(string(report))
	// Output:
	// token 42: <nil>
	// token 17 rejected, highest is 42
	// written by holder 42
}
