package transport

import "sync/atomic"

// Stats are the transport's cumulative counters since New. Once traffic has settled, every message
// handed to Send is counted exactly once in Sent, Dropped or Filtered.
type Stats struct {
	// Sent counts messages written to a peer link without error. Written is not delivered: a
	// connection that breaks right after can still lose them.
	Sent uint64
	// Batches counts batches written to peer links.
	Batches uint64
	// Dropped counts outgoing messages never written: queue full, unknown or removed peer, peer
	// unreachable, message too large, lost in a failed batch, or sent after Close.
	Dropped uint64
	// Filtered counts outgoing messages dropped by Config.Filter.
	Filtered uint64
	// SendFailures counts failed attempts to open a link or write a batch.
	SendFailures uint64
	// Reconnects counts links opened to a peer after an earlier link to it ended.
	Reconnects uint64
	// Received counts inbound messages handed to Raft.Process.
	Received uint64
	// ProcessErrors counts inbound messages for which Raft.Process returned an error.
	ProcessErrors uint64
	// Rejected counts inbound links ended because a batch was invalid (wrong cluster or recipient,
	// undecodable message, a frame too large) and messages dropped for their sender.
	Rejected uint64
}

// counters backs Stats with atomics so every goroutine can count without a lock.
type counters struct {
	sent, batches, dropped            atomic.Uint64
	filtered                          atomic.Uint64
	sendFailures, reconnects          atomic.Uint64
	received, processErrors, rejected atomic.Uint64
}

func (c *counters) snapshot() Stats {
	return Stats{
		Sent:          c.sent.Load(),
		Batches:       c.batches.Load(),
		Dropped:       c.dropped.Load(),
		Filtered:      c.filtered.Load(),
		SendFailures:  c.sendFailures.Load(),
		Reconnects:    c.reconnects.Load(),
		Received:      c.received.Load(),
		ProcessErrors: c.processErrors.Load(),
		Rejected:      c.rejected.Load(),
	}
}
