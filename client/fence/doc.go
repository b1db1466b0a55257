// Package fence defines the fenced-write contract that protects a resource
// from writers whose lease has been lost, and the errors adapters return.
//
// # Why a fence
//
// A lease is not a mutex. A holder can lose its lease without noticing in
// time: a long GC pause, a partition, a migrated VM or a slow disk can let
// the lease expire and the leased cluster grant it to someone else while the
// old holder still believes it owns the resource and goes on writing. No
// client-side check closes that gap, because the pause can happen between the
// check and the write. Only the resource itself can reject the late write.
//
// Every grant carries a fencing token: the Raft log index of the entry that
// granted it. Tokens of successive grants of a resource strictly increase, so
// the resource can tell a newer holder from an older one by comparing numbers.
//
// # The contract
//
// An adapter accepts a write for resource R with token T if and only if T is
// greater than or equal to every token it has accepted for R, and it checks
// T, records T as the highest token of R and performs the caller's write in
// one atomic step of the store (one transaction, one script, one conditional
// statement). Otherwise it performs nothing and returns a *StaleTokenError,
// which matches ErrStaleToken with errors.Is. Equal tokens are accepted: one
// holder writes many times with the token of its grant. If the caller's write
// fails, the whole step is undone: the recorded token is unchanged and
// nothing is written.
//
// Every adapter also has Claim(ctx, resource, token): the same check and
// record of the token with no data written. A new holder claims its token as
// soon as it is granted, before its first write; from then on the store
// refuses the writes of every older holder, even one that paused before the
// new holder had anything to write (see "Claim before the first write" in
// the SDK guide).
//
// The consequence (invariant I5 of the design): an adapter never accepts a
// token lower than one it accepted for the same resource, under concurrent
// writers and across restarts of the store.
//
// # Tokens and resources
//
// A token is a Raft log index. Raft log indexes start at 1, so token 0 is
// never issued and is rejected with ErrInvalidToken, as is any token above
// MaxToken (adapters store tokens as signed 64-bit integers). A resource name
// must not be empty (ErrInvalidResource). Adapters validate both with
// Validate before touching the store.
//
// # Adapters
//
// The adapters live in subpackages named after the store they use:
// memfence (in-process memory), boltfence (bbolt), pgfence (PostgreSQL via
// pgx), sqlfence (any database/sql driver, with dialects for PostgreSQL,
// MariaDB/MySQL and SQLite) and redisfence (Redis via go-redis). Each uses
// the store's own atomicity. Package fencetest holds a conformance suite that every adapter
// passes and that a new adapter can run too.
//
// The fence is only as strong as its weakest writer: every write to the
// protected data must go through the fence, or through the same atomic check
// of the same recorded token.
package fence
