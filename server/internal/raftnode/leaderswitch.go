package raftnode

import "sync"

// leaderSwitch tells whoever waits on the node's view of the leader that it changed: next returns a
// channel closed at the next change (a new leader, or losing sight of one).
type leaderSwitch struct {
	mu sync.Mutex
	ch chan struct{}
}

// next is a channel closed when the leader this node knows next changes.
func (s *leaderSwitch) next() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

// changed closes the channel of every waiter.
func (s *leaderSwitch) changed() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
}
