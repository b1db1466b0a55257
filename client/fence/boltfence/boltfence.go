// Package boltfence is a fence adapter for bbolt databases.
//
// A fenced write is one bbolt read-write transaction (DB.Update) that checks
// the token against the highest token recorded for the resource in a fence
// bucket, records the new token there, and runs the caller's function on the
// same transaction. bbolt commits all of it or none of it: a stale token or a
// failing function rolls the transaction back, so the recorded token and the
// caller's data change together or not at all. Because the tokens live in
// the same file as the data, the fence survives restarts exactly as the data
// does.
//
// Tokens are stored in the fence bucket (DefaultBucket unless WithBucket says
// otherwise) under the resource name, as 8-byte big-endian integers. Do not
// write to that bucket yourself. A resource name is a bbolt key, so it is at
// most bbolt.MaxKeySize bytes.
//
// bbolt runs one read-write transaction at a time, so fenced writes to one
// database are serialized. Use DB.Update semantics, not DB.Batch: Batch may
// run a function twice.
package boltfence

import (
	"context"
	"encoding/binary"
	"fmt"

	"go.etcd.io/bbolt"

	"github.com/leased/leased/client/fence"
)

// DefaultBucket is the name of the bucket holding the fencing tokens.
const DefaultBucket = "leased.fence.tokens"

// Fence performs fenced writes on one bbolt database. It is safe for
// concurrent use. Closing the database is the caller's business.
type Fence struct {
	db     *bbolt.DB
	bucket []byte
}

// Option configures a Fence.
type Option func(*Fence)

// WithBucket stores the tokens in the named top-level bucket instead of
// DefaultBucket.
func WithBucket(name string) Option {
	return func(f *Fence) { f.bucket = []byte(name) }
}

// New returns a Fence over db. The fence bucket is created by the first
// accepted write.
func New(db *bbolt.DB, opts ...Option) *Fence {
	f := &Fence{db: db, bucket: []byte(DefaultBucket)}
	for _, opt := range opts {
		opt(f)
	}
	return f
}

// Write performs a fenced write in one db.Update transaction: it checks
// token against the highest token recorded for resource, records token, and
// runs write on the same transaction. If token is stale it returns a
// *fence.StaleTokenError without calling write. If write returns an error,
// that error is returned and the transaction, including the token, is rolled
// back. ctx is checked before the transaction starts; bbolt itself does not
// take one.
func (f *Fence) Write(ctx context.Context, resource string, token uint64, write func(tx *bbolt.Tx) error) error {
	if err := fence.Validate(resource, token); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return f.db.Update(func(tx *bbolt.Tx) error {
		if err := f.Check(tx, resource, token); err != nil {
			return err
		}
		return write(tx)
	})
}

// Claim records token as the highest token of resource without writing any
// data, in one db.Update transaction under the same rule as Write: a token
// lower than one already accepted is refused with a *fence.StaleTokenError;
// an equal one is accepted. A new holder claims its token before its first
// write so that an older holder's late write is refused from then on.
func (f *Fence) Claim(ctx context.Context, resource string, token uint64) error {
	return f.Write(ctx, resource, token, func(*bbolt.Tx) error { return nil })
}

// Check is the building block of Write for callers that manage their own
// read-write transaction: it checks token against the highest token recorded
// for resource in tx and records token. If it returns an error the caller
// must roll tx back rather than commit it; if it returns nil, the caller's
// writes in tx are fenced when tx commits.
func (f *Fence) Check(tx *bbolt.Tx, resource string, token uint64) error {
	if err := fence.Validate(resource, token); err != nil {
		return err
	}
	b, err := tx.CreateBucketIfNotExists(f.bucket)
	if err != nil {
		return fmt.Errorf("create fence bucket: %w", err)
	}
	highest, err := decode(b.Get([]byte(resource)))
	if err != nil {
		return fmt.Errorf("read token of %q: %w", resource, err)
	}
	if err := fence.Check(resource, token, highest); err != nil {
		return err
	}
	if err := b.Put([]byte(resource), binary.BigEndian.AppendUint64(nil, token)); err != nil {
		return fmt.Errorf("record token of %q: %w", resource, err)
	}
	return nil
}

// Highest returns the highest token accepted for resource, or 0 if none.
func (f *Fence) Highest(resource string) (uint64, error) {
	var highest uint64
	err := f.db.View(func(tx *bbolt.Tx) error {
		var err error
		highest, err = f.HighestTx(tx, resource)
		return err
	})
	return highest, err
}

// HighestTx is Highest within the caller's transaction.
func (f *Fence) HighestTx(tx *bbolt.Tx, resource string) (uint64, error) {
	b := tx.Bucket(f.bucket)
	if b == nil {
		return 0, nil
	}
	highest, err := decode(b.Get([]byte(resource)))
	if err != nil {
		return 0, fmt.Errorf("read token of %q: %w", resource, err)
	}
	return highest, nil
}

// decode reads a stored token; a missing one is 0.
func decode(v []byte) (uint64, error) {
	switch len(v) {
	case 0:
		return 0, nil
	case 8:
		return binary.BigEndian.Uint64(v), nil
	}
	return 0, fmt.Errorf("corrupt token: %d bytes, want 8", len(v))
}
