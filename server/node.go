package server

import (
	"log/slog"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server/internal/auth"
	"github.com/leased/leased/server/internal/leases"
	"github.com/leased/leased/server/internal/lessor"
	"github.com/leased/leased/server/internal/membership"
	"github.com/leased/leased/server/internal/raftnode"
	"github.com/leased/leased/server/internal/rpc"
	"github.com/leased/leased/server/internal/waitq"
	"github.com/leased/leased/server/internal/watch"
)

// peerTransport is what the node needs of the peer transport (server/transport implements it;
// server/internal/sim's in-memory network in simulations).
type peerTransport interface {
	Send(msgs []*raftpb.Message)
	AddPeer(id uint64, addr string)
	RemovePeer(id uint64)
	PeerClient(id uint64) (wirepb.RaftClient, bool)
}

// logStore is what the node needs of its raft log beyond what raft reads (raftlog.Storage implements it;
// sim.Storage in simulations).
type logStore interface {
	Save(hs *raftpb.HardState, ents []*raftpb.Entry, snap *raftpb.Snapshot) error
	CreateSnapshot(i uint64, cs *raftpb.ConfState, data []byte) (*raftpb.Snapshot, error)
	Compact(compactIndex uint64) error
	Size() int64
	Close() error
}

// logIndexer is the part of raft.Storage that tells how many entries the log holds.
type logIndexer interface {
	FirstIndex() (uint64, error)
	LastIndex() (uint64, error)
}

// node wires the parts of a leased node together: the Ready loop over raft (internal/raftnode), which
// hands committed entries to the state machine's owner (internal/leases), the lessor, watch and queue
// that react to them, the membership, and the request serving (leaseOps).
type node struct {
	cfg       Config
	log       *slog.Logger
	audit     *auth.AuditTrail // the audit trail's lines, written off the loop
	authz     *auth.Authorizer
	clock     Clock
	id        uint64
	clusterID uint64
	storage   logStore
	logIndex  logIndexer // the raft log's first and last index
	// raft runs the Ready loop; other goroutines reach raft through it (internal/raftnode).
	raft      *raftnode.Node
	transport peerTransport

	// state owns the state machine: the Ready loop hands it committed entries, the rest reads through it
	// (internal/leases).
	state *leases.State

	// proposals matches applied entries to their proposers.
	proposals *raftnode.Waiter[fsm.Result]
	lessor    *lessor.Lessor
	queue     *waitq.Queue
	watch     *watch.Hub
	metrics   *metrics
	// ops serves the client requests (internal/rpc; wired in leaseops.go).
	ops *rpc.LeaseOps

	// clientAddr and peerAddr are this node's advertised addresses.
	clientAddr, peerAddr string
	// members keeps the member table, raft's configuration and the transport's peers in step, and
	// makes membership changes (internal/membership).
	members *membership.Members

	// draining closes when the node begins to shut down (Server.Close): Writes streams tell their clients.
	draining chan struct{}

	disk   *diskStats // the log's size and the volume's free space, for readers that must not wait (diskstats.go)
	faults diskFaults // injected stalls; empty unless built with -tags faultinject
	hooks  testHooks  // set only by tests (export_test.go)
}
