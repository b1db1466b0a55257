/*
Package transport carries raft messages between the nodes of a leased cluster, and gives the server a
gRPC client on the peer connections for forwarding requests to the leader.

# Basics

A node creates one Transport, serves the peer port through its Listener, registers its gRPC service
there, and tells it where the other voters and learners are:

	t, err := transport.New(transport.Config{ClusterID: cid, LocalID: id, Raft: node, Forward: fwd})
	if err != nil {
		return err
	}
	defer t.Close()
	srv := grpc.NewServer(t.ServerOptions()...)
	t.Register(srv)
	go srv.Serve(t.Listener(lis))
	t.AddPeer(2, "10.0.0.2:7001")

The Ready loop hands outgoing messages to Send; inbound messages reach the node through Raft.Process.
PeerClient returns a wirepb.RaftClient on a peer's connection for calling Forward on the leader.

# Links

Raft messages travel on links: one TCP (or TLS) connection per ordered pair of nodes, carrying
length-prefixed frames (wire.go), on the same peer port as gRPC. The Listener tells a link from a gRPC
connection by its first bytes (a hello) or, with TLS, by ALPN. A link rather than a gRPC stream because
a raft message is small and latency-bound: a gRPC stream hands each message to a writer goroutine on the
way out and to a stream goroutine on the way in, and each hand-off is a thread wake-up that on a busy
machine costs tens of microseconds — a large share of a replicated write's half millisecond.

Each peer gets a bounded queue and one goroutine that owns the link to it. Send only queues, so the
node's Ready loop never does socket I/O; the goroutine takes whatever has piled up, up to
MaxBatchMessages messages or MaxBatchBytes bytes, and writes it as one batch; it never waits to fill a
batch, so batches grow only when the link is busy. When a write fails, or
the peer ends the link (a refusal, a restart), the goroutine reconnects with jittered exponential
backoff, which resets only after a link has stayed up for BackoffMax, so a peer that keeps refusing is
retried slowly. Links are the only way raft messages travel; the gRPC service on the peer port
carries Forward and Join alone.

# What it promises

  - Send never blocks on a peer: it enqueues or drops, and returns.
  - Messages to one peer are written in the order Send received them. Nothing is reordered; after a
    failure some messages may be missing, never swapped.
  - Under overload it drops: a message whose peer queue is full, whose peer is unknown, or that arrives
    while its peer is unreachable (between reconnect attempts) is dropped. Raft is built for lossy
    networks and retries; the transport helps it by calling Raft.ReportUnreachable for the peer, so the
    leader stops pipelining appends to a follower it cannot reach.
  - Every MsgSnap handed to Send before Close gets exactly one Raft.ReportSnapshot: SnapshotFinish
    once the batch carrying it was written to the link, SnapshotFailure if it was dropped for any
    reason. A snapshot is never left pending in raft.
  - Inbound batches are checked before raft sees them: a batch for another cluster or another raft id
    ends the link with FailedPrecondition; an undecodable message ends it with InvalidArgument, a frame
    larger than MaxMsgBytes with ResourceExhausted. The sender hears why (the link's end frame) and logs it.
  - A link that ends without its sender's bye (the sender's process died, its connection broke) is
    reported through Config.OnStreamLost; one its sender closed is not.
  - A link is pinged every KeepAliveTime; one whose ping goes unanswered for a KeepAliveTime is closed
    and redialled, and the receiver closes a link silent for twice KeepAliveTime plus KeepAliveTimeout.
  - Links are dialled through the HTTP CONNECT proxy the environment names (HTTPS_PROXY, NO_PROXY), as
    gRPC dials; loopback addresses never go through one.
  - With Config.TLS, connections are mutual TLS and a certificate names its member (identity.go): a
    certificate naming no member is refused at the handshake, a dial that reaches another member than
    the one dialled is refused, and a batch whose sender is not the certificate's member is dropped and
    reported through Config.OnRejected. What the messages say is the receiver's to check (the server
    does, before raft).
  - Close stops every goroutine the transport started, ends inbound links, and waits.

# Concurrency

All Transport methods are safe for concurrent use. Send never calls into Raft; reports are delivered
by a goroutine of the transport's own, so Send can be called from the goroutine that drives raft's
Node without deadlocking it. See Raft for which goroutines call which method.

# Caveats

  - "Written" is not "delivered": the kernel accepts a batch into its buffers before the peer has it, so
    a connection that breaks right after can lose a batch that counted as sent, and a MsgSnap reported
    as SnapshotFinish may not have arrived. Raft recovers: the leader probes the follower and sends a
    new snapshot if it must. A link the peer refused (wrong cluster) may likewise swallow a batch or two
    before the sender sees the refusal.
  - Snapshots travel in-band, inside one MsgSnap message, so a large snapshot delays the messages queued
    behind it on that link, and must fit in MaxMsgBytes on both ends (see ServerOptions).
  - Send takes ownership of the messages; they are encoded by Send or later, on the peer's goroutine.
  - Stopping the gRPC server (which closes the Listener) stops new links; the links already open end
    with Close.
*/
package transport
