/*
Package transport carries raft messages between the nodes of a leased cluster over gRPC, and gives the
server a client on the same connections for forwarding requests to the leader.

# Basics

A node creates one Transport, registers its service on the peer gRPC server, and tells it where the
other voters and learners are:

	t, err := transport.New(transport.Config{ClusterID: cid, LocalID: id, Raft: node, Forward: fwd})
	if err != nil {
		return err
	}
	defer t.Close()
	srv := grpc.NewServer(t.ServerOptions()...)
	t.Register(srv)
	t.AddPeer(2, "10.0.0.2:7001")

The Ready loop hands outgoing messages to Send; inbound messages reach the node through Raft.Process.
PeerClient returns a wirepb.RaftClient on a peer's connection for calling Forward on the leader.

Each peer gets a bounded queue and one goroutine that owns one long-lived client stream (Raft.Stream)
to it. The goroutine takes whatever has piled up in the queue, up to MaxBatchMessages messages or
MaxBatchBytes bytes, and writes it as one RaftBatch; it never waits to fill a batch, so batches grow
only when the link is busy. When a write fails, or the peer ends the stream (a rejection, a restart),
the goroutine reconnects with jittered exponential backoff, which resets only after a stream has stayed
up for BackoffMax, so a peer that keeps refusing the stream is retried slowly.

# What it promises

  - Send never blocks on the network or on a peer: it enqueues or drops, and returns.
  - Messages to one peer are written in the order Send received them. Nothing is reordered; after a
    failure some messages may be missing, never swapped.
  - Under overload it drops: a message whose peer queue is full, whose peer is unknown, or that arrives
    while its peer is unreachable (between reconnect attempts) is dropped. Raft is built for lossy
    networks and retries; the transport helps it by calling Raft.ReportUnreachable for the peer, so the
    leader stops pipelining appends to a follower it cannot reach.
  - Every MsgSnap handed to Send before Close gets exactly one Raft.ReportSnapshot: SnapshotFinish
    once the batch carrying it was written to the stream, SnapshotFailure if it was dropped for any
    reason. A snapshot is never left pending in raft.
  - Inbound batches are checked before raft sees them: a batch for another cluster or another raft id
    ends the stream with FailedPrecondition; an undecodable message ends it with InvalidArgument.
  - With Config.TLS, connections are mutual TLS and a certificate names its member (identity.go): a
    certificate naming no member is refused at the handshake, a dial that reaches another member than
    the one dialled is refused, and a batch whose sender is not the certificate's member is dropped and
    reported through Config.OnRejected. What the messages say is the receiver's to check (the server
    does, before raft).
  - Close stops every goroutine the transport started, ends inbound streams, and waits.

# Concurrency

All Transport methods are safe for concurrent use. Send never calls into Raft; reports are delivered
by a goroutine of the transport's own, so Send can be called from the goroutine that drives raft's
Node without deadlocking it. See Raft for which goroutines call which method.

# Caveats

  - "Written" is not "delivered": gRPC accepts a batch into its buffers before the peer has it, so a
    connection that breaks right after can lose a batch that counted as sent, and a MsgSnap reported as
    SnapshotFinish may not have arrived. Raft recovers: the leader probes the follower and sends a new
    snapshot if it must. A stream the peer rejected (wrong cluster) may likewise swallow a batch or two
    before the sender sees the error.
  - Snapshots travel in-band, inside one MsgSnap message, so a large snapshot delays the messages queued
    behind it on that link, and must fit in MaxMsgBytes on both ends (see ServerOptions).
  - Send takes ownership of the messages; they are encoded later, on the peer's goroutine.
  - The transport does not detect a dead but silent connection while it has nothing to send; pass
    keepalive dial options (matched by the server's enforcement policy) through Config.DialOptions if
    that matters.
*/
package transport
