// Package server is a leased node: the raft Ready loop, the lessor, and the gRPC services.
//
// # Basics
//
// New opens the data dir (raftlog), restores the lease state machine (fsm) from the last snapshot and
// prepares the services; Start runs them; Close stops them. One goroutine owns the raft node and runs the
// Ready loop (internal/raftnode): persist the Ready (one WAL write, then the acked mark), send messages
// through the peer transport (never blocking), restore a received snapshot, apply committed entries,
// release ReadIndex waiters, advance.
//
// Writes are log entries, one client command per entry, so a grant's fencing token is its log index.
// A write that reaches a follower is forwarded once to the leader over the peer connection. Reads are
// linearizable through a batched ReadIndex unless a request asks for a serializable local read.
//
// The lessor (leader only) keeps every lease's deadline on the monotonic clock, proposes expirations when
// they pass, checkpoints leases that go idle so a new leader neither shortens a renewed lease nor
// immortalises a dead one, and extends every deadline when the Ready loop stalls. Renewals are in memory and
// acknowledged after a ReadIndex round confirms leadership. See docs/design.md.
//
// # Caveats
//
// The member table is rebuilt from Config.InitialCluster at every start; membership changes arrive later.
package server
