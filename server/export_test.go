package server

// Test hooks for the external test package (server_test).

// QueueLen is the number of blocking acquires queued for resource on this node.
func (s *Server) QueueLen(resource string) int {
	q := s.node.queue
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.queues[resource])
}

// Ticks is how many times the node's Ready loop has ticked.
func (s *Server) Ticks() uint64 { return s.node.ticks.Load() }

// SnapshotsRestored is how many snapshots this node received from a leader and restored.
func (s *Server) SnapshotsRestored() uint64 { return s.node.restores.Load() }
