package membership

import (
	"context"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/fsm"
)

// Host is what membership needs of the rest of the node: the state machine's member table, raft's
// configuration, status and leadership, the applied index, the peer transport, and the errors the node
// answers with.
type Host interface {
	// ReadFSM runs fn with the state machine locked for reading.
	ReadFSM(fn func(sm *fsm.FSM))
	// ApplyMembers applies a conf change's changes to the member table (Ready loop).
	ApplyMembers(index uint64, changes []fsm.MemberChange) error
	// ApplyConfChange applies a conf change to raft's configuration (Ready loop); reconfigures says it
	// changes who the members are, so that the next snapshot must name them.
	ApplyConfChange(cc raftpb.ConfChangeI, reconfigures bool)
	ProposeConfChange(ctx context.Context, cc raftpb.ConfChangeI) error
	RaftStatus() raft.Status
	TransferLeadership(ctx context.Context, to uint64)
	IsLeader() bool
	// LeaderID is the leader raft knows; KnownLeader the one the node tells others of.
	LeaderID() uint64
	KnownLeader() uint64
	AppliedIndex() uint64
	// WaitApplied waits until index is applied (errs.ErrStopped once the node stops).
	WaitApplied(ctx context.Context, index uint64) error
	// Halted closes when the node stops serving; Fail and Halt stop it.
	Halted() <-chan struct{}
	Fail(err error)
	Halt()
	AddPeer(id uint64, addr string)
	RemovePeer(id uint64)
	PeerClient(id uint64) (wirepb.RaftClient, bool)
	NotLeaderErr() error
	// ProposeErr is the error of a proposal that failed with err.
	ProposeErr(ctx context.Context, err error) error
	StoppedErr() error
	// Status turns an error into the gRPC status the node answers with.
	Status(err error) error
}
