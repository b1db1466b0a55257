package client_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.etcd.io/bbolt"
	"google.golang.org/grpc"

	"github.com/leased/leased/client"
	"github.com/leased/leased/client/fence"
	"github.com/leased/leased/client/fence/boltfence"
	"github.com/leased/leased/client/fence/memfence"
	"github.com/leased/leased/client/fence/pgfence"
	"github.com/leased/leased/client/fence/redisfence"
	"github.com/leased/leased/client/internal/servicetest"
	"github.com/leased/leased/server/servertest"
)

// fencedStore is one storage system guarded by a fence adapter, reduced to what the scenario needs.
type fencedStore struct {
	name  string
	write func(ctx context.Context, token uint64, value string) error
	claim func(ctx context.Context, token uint64) error
	read  func(ctx context.Context) (string, error)
}

func memStore() fencedStore {
	s := memfence.New()
	return fencedStore{
		name: "memory",
		write: func(ctx context.Context, tok uint64, v string) error {
			return s.Write(ctx, "orders", tok, func(tx *memfence.Tx) error { tx.Put("orders/total", []byte(v)); return nil })
		},
		claim: func(ctx context.Context, tok uint64) error { return s.Claim(ctx, "orders", tok) },
		read:  func(context.Context) (string, error) { v, _ := s.Get("orders/total"); return string(v), nil },
	}
}

func boltStore(t *testing.T) fencedStore {
	db, err := bbolt.Open(filepath.Join(t.TempDir(), "data.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	f := boltfence.New(db)
	return fencedStore{
		name: "bbolt",
		write: func(ctx context.Context, tok uint64, v string) error {
			return f.Write(ctx, "orders", tok, func(tx *bbolt.Tx) error {
				b, err := tx.CreateBucketIfNotExists([]byte("orders"))
				if err != nil {
					return err
				}
				return b.Put([]byte("total"), []byte(v))
			})
		},
		claim: func(ctx context.Context, tok uint64) error { return f.Claim(ctx, "orders", tok) },
		read: func(context.Context) (v string, err error) {
			err = db.View(func(tx *bbolt.Tx) error {
				if b := tx.Bucket([]byte("orders")); b != nil {
					v = string(b.Get([]byte("total")))
				}
				return nil
			})
			return v, err
		},
	}
}

func pgStore(t *testing.T, ctx context.Context) fencedStore {
	dsn := servicetest.Require(t, "LEASED_TEST_POSTGRES_DSN", "PostgreSQL")
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	suffix := strings.ToLower(strings.NewReplacer("/", "_", "-", "_").Replace(t.Name()))
	table := "orders_" + suffix
	f, err := pgfence.New(pool, pgfence.WithTable("fence_"+suffix))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.CreateTable(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s (id int PRIMARY KEY, total text)", table)); err != nil {
		t.Fatal(err)
	}
	return fencedStore{
		name: "postgresql",
		write: func(ctx context.Context, tok uint64, v string) error {
			return f.Write(ctx, "orders", tok, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, fmt.Sprintf("INSERT INTO %s VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET total = EXCLUDED.total", table), v)
				return err
			})
		},
		claim: func(ctx context.Context, tok uint64) error { return f.Claim(ctx, "orders", tok) },
		read: func(ctx context.Context) (v string, err error) {
			err = pool.QueryRow(ctx, fmt.Sprintf("SELECT total FROM %s WHERE id = 1", table)).Scan(&v)
			return v, err
		},
	}
}

func redisStore(t *testing.T) fencedStore {
	addr := servicetest.Require(t, "LEASED_TEST_REDIS_ADDR", "Redis")
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = rdb.Close() })
	key := "scenario:" + t.Name() + ":total"
	f := redisfence.New(rdb, redisfence.WithKeyPrefix("scenario:"+t.Name()+":fence:"))
	return fencedStore{
		name: "redis",
		write: func(ctx context.Context, tok uint64, v string) error {
			return f.Write(ctx, "orders", tok, redisfence.Set(key, v))
		},
		claim: func(ctx context.Context, tok uint64) error { return f.Claim(ctx, "orders", tok) },
		read:  func(ctx context.Context) (string, error) { return rdb.Get(ctx, key).Result() },
	}
}

// TestFrozenHolderIsFencedOffByEveryAdapter is the scenario the fence exists for. A holder acquires (t1)
// and writes; it freezes (its keep-alive stops) past its TTL; a second holder acquires (t2 > t1) and
// writes; the first wakes and writes with t1. Every adapter rejects that write and keeps the second
// holder's data.
func TestFrozenHolderIsFencedOffByEveryAdapter(t *testing.T) {
	cl := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	stores := []fencedStore{memStore(), boltStore(t), pgStore(t, ctx), redisStore(t)}

	frozen := &cutDialer{}
	a := newClient(t, cl.Endpoints(), func(cfg *client.Config) {
		cfg.Holder = "a"
		cfg.DialOptions = []grpc.DialOption{grpc.WithContextDialer(frozen.dial)}
	})
	b := newClient(t, cl.Endpoints(), func(cfg *client.Config) { cfg.Holder = "b" })

	la, err := a.Acquire(ctx, "orders", client.WithTTL(800*time.Millisecond)) // the floor
	if err != nil {
		t.Fatal(err)
	}
	t1 := la.Token()
	for _, s := range stores {
		if err := s.write(ctx, t1, "a: 100"); err != nil {
			t.Fatalf("%s: first write by the holder: %v", s.name, err)
		}
	}
	frozen.cutOff() // a stops renewing: a GC pause, a stopped VM, a partition

	lb, err := b.Acquire(ctx, "orders", client.WithTTL(5*time.Second), client.WithWait())
	if err != nil {
		t.Fatal(err)
	}
	t2 := lb.Token()
	if t2 <= t1 {
		t.Fatalf("second grant %d is not above the first %d", t2, t1)
	}
	for _, s := range stores {
		if err := s.write(ctx, t2, "b: 250"); err != nil {
			t.Fatalf("%s: write by the new holder: %v", s.name, err)
		}
	}

	// a wakes up, unaware, and writes with its old token.
	for _, s := range stores {
		err := s.write(ctx, t1, "a: 120 (stale)")
		var stale *fence.StaleTokenError
		if !errors.Is(err, fence.ErrStaleToken) || !errors.As(err, &stale) || stale.Highest != t2 {
			t.Errorf("%s: stale write returned %v, want a StaleTokenError naming %d", s.name, err, t2)
		}
		if v, err := s.read(ctx); err != nil || v != "b: 250" {
			t.Errorf("%s: stored %q (%v), want the new holder's data", s.name, v, err)
		}
	}
	// And the SDK had told a so, had it looked.
	if la.Err() == nil {
		t.Error("the frozen holder's lease still claims to be valid")
	}
}

// TestClaimFencesAFrozenHolderBeforeTheNewHolderWrites is the recipe of docs/client.md ("Claim before the
// first write"): the second holder claims its token at every store as soon as it is granted, and writes
// nothing. The first holder wakes and writes with its old token: every adapter refuses it, though the
// store has seen no write of the second holder. Without the claim the store would accept it (its highest
// token is still the first holder's).
func TestClaimFencesAFrozenHolderBeforeTheNewHolderWrites(t *testing.T) {
	cl := servertest.Start(t, 3, nil)
	ctx := ctxT(t)
	stores := []fencedStore{memStore(), boltStore(t), pgStore(t, ctx), redisStore(t)}

	frozen := &cutDialer{}
	a := newClient(t, cl.Endpoints(), func(cfg *client.Config) {
		cfg.Holder = "a"
		cfg.DialOptions = []grpc.DialOption{grpc.WithContextDialer(frozen.dial)}
	})
	b := newClient(t, cl.Endpoints(), func(cfg *client.Config) { cfg.Holder = "b" })

	la, err := a.Acquire(ctx, "orders", client.WithTTL(800*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t1 := la.Token()
	for _, s := range stores {
		if err := s.claim(ctx, t1); err != nil {
			t.Fatalf("%s: the first holder's claim: %v", s.name, err)
		}
		if err := s.write(ctx, t1, "a: 100"); err != nil {
			t.Fatalf("%s: first write by the holder: %v", s.name, err)
		}
	}
	frozen.cutOff()

	lb, err := b.Acquire(ctx, "orders", client.WithTTL(5*time.Second), client.WithWait())
	if err != nil {
		t.Fatal(err)
	}
	t2 := lb.Token()
	for _, s := range stores {
		if err := s.claim(ctx, t2); err != nil {
			t.Fatalf("%s: the new holder's claim: %v", s.name, err)
		}
	}

	for _, s := range stores {
		err := s.write(ctx, t1, "a: 120 (stale)")
		var stale *fence.StaleTokenError
		if !errors.Is(err, fence.ErrStaleToken) || !errors.As(err, &stale) || stale.Highest != t2 {
			t.Errorf("%s: the frozen holder's write after the new holder's claim returned %v, want a StaleTokenError naming %d",
				s.name, err, t2)
		}
		if v, err := s.read(ctx); err != nil || v != "a: 100" {
			t.Errorf("%s: stored %q (%v), want the first holder's last accepted write", s.name, v, err)
		}
		// The claimer claims again (a retry): equal tokens pass.
		if err := s.claim(ctx, t2); err != nil {
			t.Errorf("%s: claiming the same token again: %v", s.name, err)
		}
	}
}
