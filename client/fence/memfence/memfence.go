// Package memfence is an in-process fence adapter: a key-value map and the
// highest token accepted per resource, behind one mutex.
//
// It is meant for tests, examples and single-process programs whose protected
// state lives in memory. Nothing is durable: a new Store starts with no
// tokens, so it only protects state that dies with it.
//
// A fenced write runs the caller's function against a staged view of the
// map (a Tx); the staged changes and the new token are committed together,
// under the mutex, only if the function succeeds. A failing function or a
// stale token leaves the store exactly as it was.
package memfence

import (
	"context"
	"maps"
	"sync"

	"github.com/leased/leased/client/fence"
)

// Store is an in-memory key-value store guarded by fencing tokens. The zero
// value is not usable; call New. A Store is safe for concurrent use; fenced
// writes are serialized.
type Store struct {
	mu      sync.Mutex
	data    map[string][]byte
	highest map[string]uint64
}

// New returns an empty Store.
func New() *Store {
	return &Store{data: make(map[string][]byte), highest: make(map[string]uint64)}
}

// Write performs a fenced write: if token is at least the highest token
// accepted for resource, it runs write against a staged view of the store
// and, if write returns nil, commits its changes and records token, all
// under the store's mutex. If token is stale it returns a
// *fence.StaleTokenError without calling write. If write fails, its error is
// returned and nothing is committed.
//
// write must not retain tx or call other methods of s (the mutex is held).
func (s *Store) Write(ctx context.Context, resource string, token uint64, write func(tx *Tx) error) error {
	if err := fence.Validate(resource, token); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := fence.Check(resource, token, s.highest[resource]); err != nil {
		return err
	}
	tx := &Tx{base: s.data, staged: make(map[string][]byte), deleted: make(map[string]bool)}
	err := write(tx)
	tx.base = nil // a retained tx must not read the live map unlocked
	if err != nil {
		return err
	}
	s.commit(tx)
	s.highest[resource] = token
	return nil
}

// Claim records token as the highest token of resource without writing any
// data, under the same rule as Write: a token lower than one already accepted
// is refused with a *fence.StaleTokenError; an equal one is accepted. A new
// holder claims its token before its first write so that an older holder's
// late write is refused from then on.
func (s *Store) Claim(ctx context.Context, resource string, token uint64) error {
	return s.Write(ctx, resource, token, func(*Tx) error { return nil })
}

func (s *Store) commit(tx *Tx) {
	for k := range tx.deleted {
		delete(s.data, k)
	}
	maps.Copy(s.data, tx.staged)
}

// Get returns a copy of the value stored under key.
func (s *Store) Get(key string) (value []byte, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.data[key]
	return clone(v, ok), ok
}

// Highest returns the highest token accepted for resource, or 0 if none.
func (s *Store) Highest(resource string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.highest[resource]
}

// Tx is the staged view of a Store that a fenced write works on. Reads see
// the committed data plus the changes staged so far; changes become visible
// to others only when the write succeeds. A Tx is valid only during the
// write function it is passed to.
type Tx struct {
	base    map[string][]byte
	staged  map[string][]byte
	deleted map[string]bool
}

// Get returns a copy of the value under key, as staged so far.
func (tx *Tx) Get(key string) (value []byte, ok bool) {
	if v, ok := tx.staged[key]; ok {
		return clone(v, true), true
	}
	if tx.deleted[key] {
		return nil, false
	}
	v, ok := tx.base[key]
	return clone(v, ok), ok
}

// Put stages setting key to a copy of value.
func (tx *Tx) Put(key string, value []byte) {
	delete(tx.deleted, key)
	tx.staged[key] = clone(value, true)
}

// Delete stages removing key.
func (tx *Tx) Delete(key string) {
	delete(tx.staged, key)
	tx.deleted[key] = true
}

// clone copies v so that callers never share the store's slices; a present
// empty value stays non-nil.
func clone(v []byte, ok bool) []byte {
	if !ok {
		return nil
	}
	return append([]byte{}, v...)
}
