package server

import (
	"context"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server/internal/membership"
)

// memberNode adapts the node to membership.Host.
type memberNode struct{ *node }

var _ membership.Host = memberNode{}

func (a memberNode) ReadFSM(fn func(sm *fsm.FSM)) { a.state.Read(fn) }

func (a memberNode) Status(err error) error { return a.ops.Status(err) }

func (a memberNode) ApplyMembers(index uint64, changes []fsm.MemberChange) error {
	return a.state.ApplyMembers(index, changes)
}

func (a memberNode) ApplyConfChange(cc raftpb.ConfChangeI, reconfigures bool) {
	a.raft.ApplyConfChange(cc, reconfigures)
}

func (a memberNode) ProposeConfChange(ctx context.Context, cc raftpb.ConfChangeI) error {
	return a.raft.ProposeConfChange(ctx, cc)
}

func (a memberNode) RaftStatus() raft.Status { return a.raft.Status() }

func (a memberNode) TransferLeadership(ctx context.Context, to uint64) {
	a.raft.TransferLeadership(ctx, a.id, to)
}

func (a memberNode) LeaderID() uint64     { return a.raft.Leader() }
func (a memberNode) AppliedIndex() uint64 { return a.state.Applied() }

func (a memberNode) WaitApplied(ctx context.Context, index uint64) error {
	return a.state.WaitApplied(ctx, index, a.raft.Done())
}

func (a memberNode) Halted() <-chan struct{} { return a.raft.Done() }

func (a memberNode) AddPeer(id uint64, addr string) {
	a.transport.AddPeer(id, addr)
	a.metrics.addPeer(id)
}

func (a memberNode) RemovePeer(id uint64) {
	a.transport.RemovePeer(id)
	a.metrics.removePeer(id)
}

func (a memberNode) PeerClient(id uint64) (wirepb.RaftClient, bool) {
	return a.transport.PeerClient(id)
}

func (a memberNode) IsLeader() bool      { return a.raft.IsLeader() }
func (a memberNode) KnownLeader() uint64 { return a.raft.KnownLeader() }
func (a memberNode) Fail(err error)      { a.raft.Fail(err) }
func (a memberNode) Halt()               { a.raft.Halt() }
func (a memberNode) NotLeaderErr() error { return a.raft.NotLeaderErr() }
func (a memberNode) StoppedErr() error   { return a.raft.StoppedErr() }

func (a memberNode) ProposeErr(ctx context.Context, err error) error {
	return a.raft.ProposeErr(ctx, err)
}
