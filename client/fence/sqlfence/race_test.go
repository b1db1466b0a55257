package sqlfence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leased/leased/client/fence"
	"github.com/leased/leased/client/fence/sqlfence"
)

var errAbort = errors.New("test: the first writer aborts")

// TestFirstWriteWaitsForTheFirstWriter holds the first fenced transaction
// of a new resource open, with its token row inserted but not committed,
// and makes a lower and a higher token wait behind it. When it commits, the
// lower token must be refused (it must not have inserted a row of its own
// beside the first); when it aborts instead, both may go on, in an order
// whose tokens do not decrease.
func TestFirstWriteWaitsForTheFirstWriter(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			if b.lockWaiters == nil {
				t.Skip(b.name + " locks the whole database for a writer and cannot show who waits; " +
					"TestFirstWriteRace covers it")
			}
			for _, abort := range []bool{false, true} {
				t.Run(fmt.Sprintf("abort=%v", abort), func(t *testing.T) {
					testFirstWriteWaits(t, b, abort)
				})
			}
		})
	}
}

func testFirstWriteWaits(t *testing.T, b backend, abort bool) {
	s, db := newStore(t, b)
	f := s.fence(t, db)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	appendValue := func(value string) func(context.Context, *sql.Tx) error {
		return func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, s.placeholders(fmt.Sprintf(
				`INSERT INTO %s (resource, value) VALUES (?, ?)`, s.history)), "new", value)
			return err
		}
	}

	inside, release := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		first <- f.Write(ctx, "new", 5, func(ctx context.Context, tx *sql.Tx) error {
			if err := appendValue("5")(ctx, tx); err != nil {
				return err
			}
			close(inside)
			<-release
			if abort {
				return errAbort
			}
			return nil
		})
	}()
	select {
	case <-inside:
	case err := <-first:
		t.Fatalf("first write of token 5: %v", err)
	}
	lower, higher := make(chan error, 1), make(chan error, 1)
	go func() { lower <- f.Write(ctx, "new", 3, appendValue("3")) }()
	go func() { higher <- f.Write(ctx, "new", 7, appendValue("7")) }()
	waitForLockWaiters(ctx, t, b, db, 2)
	close(release)

	errFirst, errLower, errHigher := <-first, <-lower, <-higher
	if errHigher != nil {
		t.Errorf("token 7 = %v, want accepted", errHigher)
	}
	var stale *fence.StaleTokenError
	switch {
	case !abort && errFirst != nil:
		t.Errorf("token 5 = %v, want accepted", errFirst)
	case abort && !errors.Is(errFirst, errAbort):
		t.Errorf("aborted token 5 = %v, want %v", errFirst, errAbort)
	case !abort && !errors.As(errLower, &stale):
		t.Errorf("token 3 after 5 committed = %v, want stale", errLower)
	case errLower != nil && !errors.As(errLower, &stale):
		t.Errorf("token 3 after 5 aborted = %v, want accepted or stale", errLower)
	}
	if got, err := f.Highest(ctx, "new"); err != nil || got != 7 {
		t.Errorf("Highest = %d, %v; want 7", got, err)
	}
	hist, err := history(ctx, s, db, "new")
	if err != nil {
		t.Fatal(err)
	}
	checkNonDecreasing(t, hist)
	t.Logf("history %q; token 3: %v", hist, errLower)
}

// waitForLockWaiters polls until n sessions wait on a lock, or fails at the
// context's deadline. It polls every 150ms because InnoDB refreshes the
// table it reads only once nobody has read it for 100ms.
func waitForLockWaiters(ctx context.Context, t *testing.T, b backend, db *sql.DB, n int) {
	t.Helper()
	tick := time.NewTicker(150 * time.Millisecond)
	defer tick.Stop()
	for {
		waiting, err := b.lockWaiters(ctx, db)
		if err != nil {
			t.Fatalf("poll lock waiters: %v", err)
		}
		if waiting >= n {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d sessions waiting on locks, want %d: %v", waiting, n, ctx.Err())
		case <-tick.C:
		}
	}
}

// TestFirstWriteRace starts writers with distinct tokens on a new resource
// at once, round after round: whatever the interleaving, the writes
// accepted must be in non-decreasing token order, the greatest token must
// be accepted, and it must be the one recorded.
func TestFirstWriteRace(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			const rounds, writers = 25, 6
			s, db := newStore(t, b)
			f := s.fence(t, db)
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			rng := rand.New(rand.NewPCG(uint64(runID), 1))
			var accepted, refused int
			for round := range rounds {
				resource := "race-" + strconv.Itoa(round)
				tokens := rng.Perm(writers)
				errs := make([]error, writers)
				start := make(chan struct{})
				var wg sync.WaitGroup
				for i, token := range tokens {
					wg.Go(func() {
						<-start
						value := strconv.Itoa(token + 1)
						errs[i] = f.Write(ctx, resource, uint64(token+1), func(ctx context.Context, tx *sql.Tx) error {
							_, err := tx.ExecContext(ctx, s.placeholders(fmt.Sprintf(
								`INSERT INTO %s (resource, value) VALUES (?, ?)`, s.history)), resource, value)
							return err
						})
					})
				}
				close(start)
				wg.Wait()
				for i, err := range errs {
					var stale *fence.StaleTokenError
					switch {
					case err == nil:
						accepted++
					case errors.As(err, &stale):
						refused++
					default:
						t.Fatalf("round %d, token %d: %v", round, tokens[i]+1, err)
					}
					if tokens[i]+1 == writers && err != nil {
						t.Errorf("round %d: the greatest token %d was refused: %v", round, writers, err)
					}
				}
				if got, err := f.Highest(ctx, resource); err != nil || got != writers {
					t.Errorf("round %d: Highest = %d, %v; want %d", round, got, err, writers)
				}
				hist, err := history(ctx, s, db, resource)
				if err != nil {
					t.Fatal(err)
				}
				checkNonDecreasing(t, hist)
			}
			t.Logf("%d rounds of %d writers: %d accepted, %d refused", rounds, writers, accepted, refused)
		})
	}
}

// checkNonDecreasing checks invariant I5 on a history of decimal tokens.
func checkNonDecreasing(t *testing.T, hist []string) {
	t.Helper()
	prev := 0
	for i, v := range hist {
		token, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("history[%d] = %q", i, v)
		}
		if token < prev {
			t.Errorf("I5 violated: token %d accepted after %d (history %s)", token, prev, strings.Join(hist, ","))
		}
		prev = max(prev, token)
	}
}

// TestResourceNamesAreExact checks that names differing only in case or in
// trailing spaces are different resources (MariaDB's default collations
// would fold them together; the VARBINARY column does not).
func TestResourceNamesAreExact(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			s, db := newStore(t, b)
			f := s.fence(t, db)
			ctx := t.Context()
			noop := func(context.Context, *sql.Tx) error { return nil }
			names := []string{"orders/a", "Orders/A", "orders/a ", "orders/á"}
			for i, name := range names {
				if err := f.Write(ctx, name, uint64(10-i), noop); err != nil {
					t.Fatalf("Write(%q, %d): %v", name, 10-i, err)
				}
			}
			for i, name := range names {
				if got, err := f.Highest(ctx, name); err != nil || got != uint64(10-i) {
					t.Errorf("Highest(%q) = %d, %v; want %d", name, got, err, 10-i)
				}
			}
			long := strings.Repeat("x", sqlfence.MaxResourceBytes+1)
			if err := f.Write(ctx, long, 1, noop); !errors.Is(err, fence.ErrInvalidResource) {
				t.Errorf("Write of a %d-byte name = %v, want ErrInvalidResource", len(long), err)
			}
			if err := f.Write(ctx, long[1:], 1, noop); err != nil {
				t.Errorf("Write of a %d-byte name = %v, want accepted", len(long)-1, err)
			}
		})
	}
}
