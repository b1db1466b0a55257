package server

import "github.com/leased/leased/fsm"

// Test hooks for the peer-input tests (server_test).

// HasLease reports whether this node's own state machine holds a live lease on resource, without asking
// the leader: what a snapshot the node restored put there.
func (s *Server) HasLease(resource string) (ok bool) {
	s.node.state.Read(func(sm *fsm.FSM) { _, ok = sm.Get(resource) })
	return ok
}

// Term is the node's raft term as its peer checks see it.
func (s *Server) Term() uint64 { return s.node.raft.Term() }
