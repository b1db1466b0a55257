package boltfence_test

import (
	"context"
	"encoding/binary"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.etcd.io/bbolt"
	"go.uber.org/goleak"

	"github.com/leased/leased/client/fence/boltfence"
	"github.com/leased/leased/client/fence/fencetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	fencetest.Run(t, newHarness)
}

// harness keeps each resource's history in bucket "history/<resource>",
// one value per key, keyed by the bucket's sequence. Reopen closes and
// reopens the file, excluding the other methods while it does.
type harness struct {
	path string
	mu   sync.RWMutex
	db   *bbolt.DB
}

func newHarness(t *testing.T) fencetest.Harness {
	h := &harness{path: filepath.Join(t.TempDir(), "fence.db")}
	if err := h.open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if err := h.db.Close(); err != nil {
			t.Error(err)
		}
	})
	return h
}

func (h *harness) open() error {
	db, err := bbolt.Open(h.path, 0o600, &bbolt.Options{Timeout: 10 * time.Second, NoSync: true})
	if err != nil {
		return err
	}
	h.db = db
	return nil
}

func (h *harness) Reopen(context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.db.Close(); err != nil {
		return err
	}
	return h.open()
}

func historyBucket(resource string) []byte { return []byte("history/" + resource) }

func appendTo(tx *bbolt.Tx, resource, value string) error {
	b, err := tx.CreateBucketIfNotExists(historyBucket(resource))
	if err != nil {
		return err
	}
	seq, err := b.NextSequence()
	if err != nil {
		return err
	}
	return b.Put(binary.BigEndian.AppendUint64(nil, seq), []byte(value))
}

func (h *harness) Append(ctx context.Context, resource string, token uint64, value string) error {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return boltfence.New(h.db).Write(ctx, resource, token, func(tx *bbolt.Tx) error {
		return appendTo(tx, resource, value)
	})
}

func (h *harness) AppendThenFail(ctx context.Context, resource string, token uint64, value string, failure error) error {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return boltfence.New(h.db).Write(ctx, resource, token, func(tx *bbolt.Tx) error {
		if err := appendTo(tx, resource, value); err != nil {
			return err
		}
		return failure
	})
}

func (h *harness) Claim(ctx context.Context, resource string, token uint64) error {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return boltfence.New(h.db).Claim(ctx, resource, token)
}

func (h *harness) History(_ context.Context, resource string) ([]string, error) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	var hist []string
	err := h.db.View(func(tx *bbolt.Tx) error {
		b := tx.Bucket(historyBucket(resource))
		if b == nil {
			return nil
		}
		return b.ForEach(func(_, v []byte) error {
			hist = append(hist, string(v))
			return nil
		})
	})
	return hist, err
}

func (h *harness) Highest(_ context.Context, resource string) (uint64, error) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return boltfence.New(h.db).Highest(resource)
}

func TestWithBucketAndCorruptToken(t *testing.T) {
	db, err := bbolt.Open(filepath.Join(t.TempDir(), "x.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	f := boltfence.New(db, boltfence.WithBucket("tokens"))
	ctx := context.Background()
	if err := f.Write(ctx, "r", 3, func(*bbolt.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket([]byte("tokens")).Put([]byte("r"), []byte("bad"))
	}); err != nil {
		t.Fatal(err)
	}
	called := false
	err = f.Write(ctx, "r", 4, func(*bbolt.Tx) error { called = true; return nil })
	if err == nil || called {
		t.Fatalf("write over a corrupt token: err=%v called=%v, want an error and no write", err, called)
	}
}
