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

// A new holder claims its token as soon as it is granted. An old holder that
// paused, and wakes before the new holder has written anything, is refused
// all the same.
func ExampleStore_Claim() {
	ctx := context.Background()
	store := memfence.New()

	// The old holder (token 17) wrote, then paused past its lease.
	_ = store.Write(ctx, "report-job", 17, func(tx *memfence.Tx) error {
		tx.Put("report", []byte("draft by holder 17"))
		return nil
	})

	// The new holder is granted token 42 and claims it before any write.
	fmt.Println("claim 42:", store.Claim(ctx, "report-job", 42))

	// The old holder wakes and writes: refused, though 42 has written nothing.
	err := store.Write(ctx, "report-job", 17, func(tx *memfence.Tx) error {
		tx.Put("report", []byte("late write by holder 17"))
		return nil
	})
	fmt.Println("late write refused:", errors.Is(err, fence.ErrStaleToken))

	report, _ := store.Get("report")
	fmt.Println(string(report))
	// Output:
	// claim 42: <nil>
	// late write refused: true
	// draft by holder 17
}
