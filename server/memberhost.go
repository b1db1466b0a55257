package server

import (
	"context"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/fsm"
)

// memberHost is what membership needs of the rest of the node: the state machine's member table, raft's
// configuration, status and leadership, the applied index, the peer transport, and the errors the node
// answers with.
type memberHost interface {
	// readFSM runs fn with the state machine locked for reading.
	readFSM(fn func(sm *fsm.FSM))
	// applyMembers applies a conf change's changes to the member table (Ready loop).
	applyMembers(index uint64, changes []fsm.MemberChange) error
	// applyConfChange applies a conf change to raft's configuration (Ready loop); reconfigures says it
	// changes who the members are, so that the next snapshot must name them.
	applyConfChange(cc raftpb.ConfChangeI, reconfigures bool)
	proposeConfChange(ctx context.Context, cc raftpb.ConfChangeI) error
	raftStatus() raft.Status
	transferLeadership(ctx context.Context, to uint64)
	isLeader() bool
	// leaderID is the leader raft knows; knownLeader the one the node tells others of.
	leaderID() uint64
	knownLeader() uint64
	appliedIndex() uint64
	// waitApplied waits until index is applied (ErrStopped once the node stops).
	waitApplied(ctx context.Context, index uint64) error
	// halted closes when the node stops serving; fail and halt stop it.
	halted() <-chan struct{}
	fail(err error)
	halt()
	addPeer(id uint64, addr string)
	removePeer(id uint64)
	peerClient(id uint64) (wirepb.RaftClient, bool)
	notLeaderErr() error
	proposeErr(ctx context.Context, err error) error
	stoppedErr() error
	status(err error) error
}

// memberNode adapts the node to memberHost.
type memberNode struct{ *node }

var _ memberHost = memberNode{}

func (a memberNode) readFSM(fn func(sm *fsm.FSM)) { a.state.Read(fn) }

func (a memberNode) status(err error) error { return a.ops.status(err) }

func (a memberNode) applyMembers(index uint64, changes []fsm.MemberChange) error {
	return a.state.ApplyMembers(index, changes)
}

func (a memberNode) applyConfChange(cc raftpb.ConfChangeI, reconfigures bool) {
	a.confState = a.host.rn.ApplyConfChange(cc)
	if reconfigures {
		a.snapshots.ConfChanged()
	}
}

func (a memberNode) proposeConfChange(ctx context.Context, cc raftpb.ConfChangeI) error {
	return a.raft.ProposeConfChange(ctx, cc)
}

func (a memberNode) raftStatus() raft.Status { return a.raft.Status() }

func (a memberNode) transferLeadership(ctx context.Context, to uint64) {
	a.raft.TransferLeadership(ctx, a.id, to)
}

func (a memberNode) leaderID() uint64     { return a.leader.Load() }
func (a memberNode) appliedIndex() uint64 { return a.state.Applied() }

func (a memberNode) waitApplied(ctx context.Context, index uint64) error {
	return a.state.WaitApplied(ctx, index, a.done)
}

func (a memberNode) halted() <-chan struct{} { return a.done }

func (a memberNode) addPeer(id uint64, addr string) {
	a.transport.AddPeer(id, addr)
	a.metrics.addPeer(id)
}

func (a memberNode) removePeer(id uint64) {
	a.transport.RemovePeer(id)
	a.metrics.removePeer(id)
}

func (a memberNode) peerClient(id uint64) (wirepb.RaftClient, bool) {
	return a.transport.PeerClient(id)
}
