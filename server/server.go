package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/raftlog"
	"github.com/leased/leased/server/internal/auth"
	"github.com/leased/leased/server/internal/clock"
	"github.com/leased/leased/server/internal/ids"
	"github.com/leased/leased/server/internal/lessor"
	"github.com/leased/leased/server/internal/membership"
	"github.com/leased/leased/server/internal/raftnode"
	"github.com/leased/leased/server/internal/rpc"
	"github.com/leased/leased/server/internal/waitq"
	"github.com/leased/leased/server/internal/watch"
	"github.com/leased/leased/server/transport"
)

// Server is one leased node: raft, the lease state machine, the lessor, and the gRPC services on the
// client and peer addresses. Create it with New, then Start it; Close stops it.
type Server struct {
	cfg       Config
	log       *slog.Logger
	node      *node
	transport *transport.Transport
	gossip    *membership.Gossip // nil without Config.GossipAddr
	clientSrv *grpc.Server
	peerSrv   *grpc.Server
	clientLis net.Listener
	peerLis   net.Listener
	health    *health.Server
	gateway   *rpc.Gateway // nil without Config.HTTPAddr
	lessorOut chan lessor.Cmd

	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// Listeners lets tests (and socket activation) hand in listeners bound in advance, so that every node's
// address is known before any node starts. When nil, New listens on the configured addresses.
type Listeners struct {
	Client, Peer net.Listener
	// HTTP serves the HTTP/JSON API; when nil it is bound to Config.HTTPAddr, if that is set.
	HTTP net.Listener
}

// New opens the data dir, restores state and prepares the services. It starts nothing.
//
// Who the node is comes from the data dir once it exists: its cluster and raft id are recorded there, and
// the member table is in its log, so InitialCluster and InitialClusterState only matter on the first
// start (decision 11). A first start founds a cluster from InitialCluster, or, with state "existing",
// asks the members listed there for the cluster it was added to (discover.go).
func New(cfg Config, lis Listeners) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := checkNotRemoved(cfg.DataDir, cfg.Name); err != nil {
		return nil, err
	}
	var g *membership.Gossip
	if cfg.GossipAddr != "" {
		var err error
		if g, err = membership.StartGossip(memberConfig(cfg), cfg.Logger.With("node", cfg.Name)); err != nil {
			return nil, err
		}
	}
	s, err := open(cfg, lis, g)
	if err != nil {
		if g != nil {
			err = errors.Join(err, g.Close())
		}
		return nil, err
	}
	s.gossip = g
	s.node.members.SetGossip(g)
	return s, nil
}

// memberConfig is what membership needs of cfg.
func memberConfig(cfg Config) membership.Config {
	return membership.Config{
		Name: cfg.Name, ClientAddr: membership.Advertised(cfg.AdvertiseClientAddr, cfg.ClientAddr),
		PeerAddr: membership.Advertised(cfg.AdvertisePeerAddr, cfg.PeerAddr), InitialCluster: cfg.InitialCluster,
		PeerTLS: cfg.PeerTLS != nil, TickInterval: cfg.TickInterval, ElectionTimeout: cfg.ElectionTimeout(),
		ProposalTimeout: cfg.ProposalTimeout, GossipAddr: cfg.GossipAddr, GossipAdvertise: cfg.AdvertiseGossipAddr,
		GossipKey: cfg.GossipKey, Join: cfg.Join, Version: cfg.Version,
	}
}

// open finds out who the node is, opens its data dir and builds the server (New without gossip).
func open(cfg Config, lis Listeners, g *membership.Gossip) (*Server, error) {
	id, joined, err := identify(cfg, g)
	if err != nil {
		return nil, withDataRunbook(err)
	}
	storage, err := raftlog.Open(cfg.DataDir, id)
	if err != nil {
		return nil, withDataRunbook(err)
	}
	// Only a founding member under its founding id bootstraps the founding configuration; a member the
	// cluster added (or added again under a new id) learns its configuration from the leader.
	if joined != nil || id.NodeID != ids.Member(id.ClusterID, cfg.Name) {
		cfg.InitialClusterState = ClusterStateExisting
	}
	var seed []*leasepb.Member
	if joined != nil {
		seed = joined.GetMembers()
	} else if cfg.InitialClusterState == ClusterStateExisting && logEmpty(storage) {
		// A joining node stopped before the leader sent it anything: ask again for its peers.
		if joined, err = discover(cfg, g, false); err == nil && joined.GetRemoved() {
			err = removedDirErr(cfg.DataDir, cfg.Name, "the cluster says so")
		}
		if err != nil {
			_ = storage.Close()
			return nil, fmt.Errorf("join the cluster: %w", err)
		}
		seed = joined.GetMembers()
	}
	s, err := build(cfg, id, storage, lis, seed)
	if err != nil {
		_ = storage.Close()
		closeListeners(lis)
		return nil, err
	}
	return s, nil
}

// identify returns the node's cluster and raft id: recorded in the data dir, or, on a first start, derived
// from InitialCluster (a new cluster) or learned from the cluster it joins (with that cluster's answer).
// A first start whose cluster knows the member as one that has run is a wiped member
// (internal/membership/rejoin.go).
func identify(cfg Config, g *membership.Gossip) (raftlog.Identity, *wirepb.JoinResponse, error) {
	have, ok, err := raftlog.ReadIdentity(cfg.DataDir)
	if err != nil {
		return raftlog.Identity{}, nil, err
	}
	if ok {
		if !ids.IsIncarnation(have.ClusterID, cfg.Name, have.NodeID) {
			return raftlog.Identity{}, nil, fmt.Errorf("data dir %s belongs to %v, but a node named %q in that cluster would be %016x "+
				"(another --name?): use the original name, or a new data dir for a new member", cfg.DataDir, have, cfg.Name, ids.Member(have.ClusterID, cfg.Name))
		}
		return have, nil, nil
	}
	var resp *wirepb.JoinResponse
	if cfg.InitialClusterState == ClusterStateExisting {
		if resp, err = discover(cfg, g, false); err != nil {
			return raftlog.Identity{}, nil, fmt.Errorf("join the cluster: %w", err)
		}
	} else {
		var founder raftlog.Identity
		if founder, resp, err = foundingPeersSay(cfg); err != nil || resp == nil {
			return founder, nil, err
		}
	}
	if resp.GetStarted() || resp.GetRemoved() {
		resp, err = rejoinOrRefuse(cfg, g, resp)
	} else {
		resp, err = checkJoinAnswer(cfg, resp)
	}
	if err != nil {
		return raftlog.Identity{}, nil, err
	}
	return raftlog.Identity{ClusterID: resp.GetClusterId(), NodeID: resp.GetMember().GetId()}, resp, nil
}

// foundingPeersSay is a founding member's identity from InitialCluster, and what its peers know of it
// (probePeers): nil when they know of no cluster that has run with it yet, so that it founds as usual.
func foundingPeersSay(cfg Config) (raftlog.Identity, *wirepb.JoinResponse, error) {
	if len(cfg.InitialCluster) == 0 {
		return raftlog.Identity{}, nil, errors.New("initial cluster is required on a node's first start: it gives the cluster id and every founding member's peer address")
	}
	cid := clusterIDOf(cfg)
	founder := raftlog.Identity{ClusterID: cid, NodeID: ids.Member(cid, cfg.Name)}
	resp, err := probePeers(cfg)
	switch {
	case err != nil:
		return raftlog.Identity{}, nil, fmt.Errorf("found the cluster: %w", err)
	case resp == nil:
		return founder, nil, nil // a new cluster: the others are not up yet
	case !resp.GetStarted() && !resp.GetRemoved() && resp.GetClusterId() == cid && resp.GetMember().GetId() == founder.NodeID:
		return founder, nil, nil // a founding member's first start after the others'
	}
	return founder, resp, nil // a member that has run, or one added again under a new id
}

// logEmpty reports whether a raft log holds nothing yet (no entry, no snapshot).
func logEmpty(st interface{ LastIndex() (uint64, error) }) bool {
	last, err := st.LastIndex()
	return err == nil && last == 0
}

func build(cfg Config, id raftlog.Identity, storage *raftlog.Storage, lis Listeners, seed []*leasepb.Member) (*Server, error) {
	// The client port's gRPC metrics per method and code (grpc_server_*), with the handling-time
	// histogram; registered first, so that a Registerer that has them already fails before anything starts.
	rpcMetrics := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(
		grpcprom.WithHistogramBuckets(prometheus.ExponentialBuckets(0.0005, 2, 16))))
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(rpcMetrics); err != nil {
			return nil, fmt.Errorf("register gRPC metrics: %w", err)
		}
	}
	if err := bindListeners(&cfg, &lis); err != nil {
		return nil, err
	}
	var tr *transport.Transport
	s, err := newServer(cfg, id, storage, func(n *node) (peerTransport, error) {
		var err error
		tr, err = transport.New(transport.Config{
			ClusterID: id.ClusterID, LocalID: id.NodeID, Raft: raftAdapter{n}, Forward: n.ops.ServeForward, Join: n.members.ServeJoin,
			Logger: n.log, OnRoundTrip: n.metrics.peerRoundTrip, OnDropped: n.metrics.peerDropped, OnStreamLost: n.raft.StreamLost,
			TLS: cfg.PeerTLS, MemberID: n.members.MemberByName, OnRejected: n.metrics.peerRejected,
			AllowedCNs: cfg.PeerCertAllowedCNs, AllowedHostnames: cfg.PeerCertAllowedHostnames,
			// A peer that comes back is dialed again within half an election timeout, so a restarted
			// node is reachable before the next election needs its vote.
			BackoffMax: max(cfg.ElectionTimeout()/2, transport.DefaultBackoffMin),
		})
		return tr, err
	}, seed)
	if err != nil {
		if tr != nil {
			err = errors.Join(err, tr.Close())
		}
		closeListeners(lis)
		return nil, fmt.Errorf("node on %s: %w", storage.Path(), err)
	}
	gate := rpc.NewConnGate(s.cfg.Limits.MaxConnections, cfg.Registerer)
	s.transport, s.clientLis, s.peerLis = tr, gate.Listener(lis.Client), lis.Peer
	s.clientSrv = grpc.NewServer(append(append(clientServerOptions(cfg),
		grpc.ChainUnaryInterceptor(rpcMetrics.UnaryServerInterceptor(), s.node.authz.Unary),
		grpc.ChainStreamInterceptor(rpcMetrics.StreamServerInterceptor(), s.node.authz.Stream)),
		rpc.ConnLimits(cfg.Limits.MaxStreamsPerConn)...)...)
	leases := rpc.NewLeasesService(s.node.ops)
	leasepb.RegisterLeasesServer(s.clientSrv, leases)
	leasepb.RegisterClusterServer(s.clientSrv, rpc.NewClusterService(s.node.ops))
	s.health = rpc.NewHealth()
	healthpb.RegisterHealthServer(s.clientSrv, s.health)
	reflection.Register(s.clientSrv)          // grpcurl and friends list and call the services without the protos
	rpcMetrics.InitializeMetrics(s.clientSrv) // every method's series, at 0
	if lis.HTTP != nil {
		if s.gateway, err = rpc.NewGateway(s.node.log, s.node.cfg.Limits, leases, gate.Listener(lis.HTTP), cfg.ClientTLS); err != nil {
			closeListeners(lis)
			return nil, err
		}
	}
	s.peerSrv = grpc.NewServer(tr.ServerOptions()...)
	tr.Register(s.peerSrv)
	return s, nil
}

// The client port's flow-control windows for what clients send. Setting them turns off gRPC's
// bandwidth-delay estimator, which otherwise answers nearly every request of a client that is not
// streaming bulk data with a window update and a PING (and the client with a PING ack): two more
// writes per request. Requests are small (Limits.MaxRequestBytes); these bound what one connection can
// have buffered unread, below the estimator's own ceiling (16 MiB).
const (
	clientStreamWindow = 1 << 20
	clientConnWindow   = 4 << 20
)

// clientServerOptions are the client port's gRPC options: the request size limit, and keepalive both
// ways — the node pings idle connections so that a vanished client's streams end (KeepAlive, Watch and
// the waiters they hold are bounded, decision 14), and it accepts the SDK's pings down to KeepAliveMinTime,
// with or without streams. A connection with no call open for MaxConnectionIdle is closed (a GOAWAY the
// SDK answers by dialing again when it next calls), and so is one whose handshake takes longer than
// rpc.HandshakeTimeout (internal/rpc/connlimit.go).
func clientServerOptions(cfg Config) []grpc.ServerOption {
	idle := cfg.Limits.MaxConnectionIdle
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(cfg.Limits.MaxRequestBytes),
		// Fixed receive windows: see clientStreamWindow.
		grpc.InitialWindowSize(clientStreamWindow),
		grpc.InitialConnWindowSize(clientConnWindow),
		grpc.ConnectionTimeout(min(rpc.HandshakeTimeout, idle)),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: cfg.KeepAliveTime, Timeout: cfg.KeepAliveTimeout, MaxConnectionIdle: idle}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: cfg.KeepAliveMinTime, PermitWithoutStream: true}),
	}
	if cfg.ClientTLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(cfg.ClientTLS)))
	}
	return opts
}

// nodeStorage is a node's raft log: what raft reads, and what the node writes (raftlog.Storage; an
// in-memory log in simulations).
type nodeStorage interface {
	raft.Storage
	logStore
}

// newServer builds a node from its parts — its raft log, and a peer transport made once the node exists
// (the transport delivers to it) — restoring the state machine from the log's snapshot. It opens no
// listener and starts nothing: New adds the gRPC services on top; simulations run the node as it is,
// with an in-memory log and network. cfg's addresses are only reported, never listened on.
//
// seed are members to reach before the log says who the members are (a joining node's first start).
func newServer(cfg Config, id raftlog.Identity, storage nodeStorage, newTransport func(*node) (peerTransport, error), seed []*leasepb.Member) (*Server, error) {
	cfg.Limits = cfg.limits() // what the edge enforces: MinTTL 0 is the TTL floor
	snap, err := storage.Snapshot()
	if err != nil {
		return nil, fmt.Errorf("read snapshot: %w", err)
	}
	sm, snapIndex := fsm.New(), snap.GetMetadata().GetIndex()
	if snapIndex > 0 {
		if sm, err = fsm.Restore(snap.GetData()); err != nil {
			return nil, fmt.Errorf("restore snapshot at %d: %w", snapIndex, err)
		}
	}
	sm.SetClusterID(id.ClusterID) // snapshots and backups say whose state they are (fsm/lineage.go)
	out := make(chan lessor.Cmd, 4096)
	n := &node{
		cfg: cfg, log: cfg.Logger.With("node", cfg.Name), clock: cfg.Clock,
		id: id.NodeID, clusterID: id.ClusterID, storage: storage,
		proposals:  raftnode.NewWaiter[fsm.Result](),
		lessor:     lessor.New(lessorConfig(cfg), out),
		queue:      waitq.New(cfg.Limits.MaxWaiters, cfg.Limits.MaxWaitersPerResource, cfg.Limits.MaxWaitersPerIdentity),
		watch:      watch.New(cfg.WatchHistory, cfg.WatchHistoryBytes, cfg.Limits.MaxWatchers, snapIndex+1),
		clientAddr: membership.Advertised(cfg.AdvertiseClientAddr, cfg.ClientAddr),
		peerAddr:   membership.Advertised(cfg.AdvertisePeerAddr, cfg.PeerAddr),
		draining:   make(chan struct{}),
	}
	n.state = newLeaseState(n, sm, snapIndex)
	logPath, walPath := cfg.DataDir, (func() string)(nil)
	if w, ok := storage.(interface{ WALPath() string }); ok {
		walPath = w.WALPath
	}
	mcfg := memberConfig(cfg)
	if p, ok := storage.(interface{ Path() string }); ok {
		logPath = p.Path()
		mcfg.MarkRemoved = func(why string) error { return writeRemovedMarker(cfg.DataDir, why) }
	}
	n.members = membership.New(mcfg, n.log, n.id, n.clusterID, memberNode{n}, storage)
	if sm.WasRemoved(id.NodeID) {
		return nil, removedDirErr(cfg.DataDir, cfg.Name, fmt.Sprintf("per the snapshot at index %d", snapIndex))
	}
	// The Authorizer's refusals take the leader hint of n.ops, built below once the metrics are.
	n.authz = auth.New(cfg.ClientCertAuth, n.state.Read, func(err error) error { return n.ops.Status(err) })
	audit := n.log
	if cfg.AuditLog != nil {
		audit = cfg.AuditLog.With("node", cfg.Name)
	}
	n.audit = auth.NewAuditTrail(audit, snapIndex)
	n.logIndex = storage
	n.disk = newDiskStats(storage, cfg.DataDir)
	n.metrics = newMetrics(cfg.Registerer, n)
	n.raft = newRaft(n, storage, snap, logPath, walPath)
	n.ops = newLeaseOps(n, rpc.NewMetrics(cfg.Registerer, n.metrics.proposals.WithLabelValues(outcomeRefused)))
	n.lessor.Reset(sm, cfg.Clock.Now())
	if n.transport, err = newTransport(n); err != nil {
		return nil, err
	}
	n.members.SyncPeers()     // the table restored from the snapshot
	n.members.SeedPeers(seed) // a joining node's first contacts
	var peers []raft.Peer
	if cfg.InitialClusterState != ClusterStateExisting {
		if peers, err = n.members.InitialMembers(); err != nil {
			return nil, err
		}
	}
	if err := n.raft.StartRaft(peers); err != nil {
		return nil, err
	}
	return &Server{cfg: cfg, log: n.log, node: n, lessorOut: out, stop: make(chan struct{})}, nil
}

func bindListeners(cfg *Config, lis *Listeners) error {
	var err error
	if lis.Client == nil {
		if lis.Client, err = net.Listen("tcp", cfg.ClientAddr); err != nil {
			return fmt.Errorf("listen for clients: %w", err)
		}
	}
	if lis.Peer == nil {
		if lis.Peer, err = net.Listen("tcp", cfg.PeerAddr); err != nil {
			_ = lis.Client.Close()
			return fmt.Errorf("listen for peers: %w", err)
		}
	}
	if lis.HTTP == nil && cfg.HTTPAddr != "" {
		if lis.HTTP, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
			_ = lis.Client.Close()
			_ = lis.Peer.Close()
			return fmt.Errorf("listen for http: %w", err)
		}
	}
	cfg.ClientAddr, cfg.PeerAddr = lis.Client.Addr().String(), lis.Peer.Addr().String()
	if lis.HTTP != nil {
		cfg.HTTPAddr = lis.HTTP.Addr().String()
	}
	return nil
}

func closeListeners(lis Listeners) {
	for _, l := range []net.Listener{lis.Client, lis.Peer, lis.HTTP} {
		if l != nil {
			_ = l.Close()
		}
	}
}

// Start serves clients and peers and runs the node until Close.
func (s *Server) Start() {
	s.spawn(func() { s.node.raft.Run(s.stop) })
	s.spawn(func() { s.node.disk.run(s.stop, s.node.storage, s.cfg.DataDir) })
	s.spawn(s.node.audit.Run)
	s.spawn(func() { s.node.watch.Notify(s.stop) })
	s.spawn(s.proposeLessorCommands)
	s.spawnCtx(s.node.members.AutoPromote)
	s.spawnCtx(s.node.members.AnnounceLoop)
	s.spawnCtx(s.node.members.RemovalLoop)
	if s.gossip != nil {
		s.spawnCtx(s.node.members.GossipLoop)
	}
	if s.peerSrv != nil { // nil when built by newServer alone (simulations)
		s.spawn(func() { _ = s.peerSrv.Serve(s.transport.Listener(s.peerLis)) })
		s.spawn(func() { _ = s.clientSrv.Serve(s.clientLis) })
		s.spawn(func() { rpc.FollowHealth(s.health, s.Ready, s.cfg.TickInterval, s.node.raft.Done(), s.stop) })
	}
	if s.gateway != nil {
		s.spawn(s.gateway.Serve)
	}
	if s.cfg.PeerTLS == nil && !isLoopback(s.cfg.PeerAddr) {
		s.log.Warn("peer port is plaintext on a non-loopback address (--insecure-peer): anyone who reaches it can "+
			"forge raft messages; use peer TLS (docs/security.md)", "peer_addr", s.cfg.PeerAddr)
	}
	if s.gossip != nil && len(s.cfg.GossipKey) == 0 && !isLoopback(s.cfg.GossipAddr) {
		s.log.Warn("gossip is unencrypted on a non-loopback address (--insecure-gossip): anyone who reaches it can join "+
			"the pool; use --gossip-key-file (docs/security.md)", "gossip_addr", s.cfg.GossipAddr)
	}
	s.log.Info("node started", "id", leasepb.FormatID(s.node.id), "cluster", leasepb.FormatID(s.node.clusterID),
		"client_addr", s.node.clientAddr, "peer_addr", s.node.peerAddr, "http_addr", s.cfg.HTTPAddr)
}

func (s *Server) spawn(fn func()) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		fn()
	}()
}

// spawnCtx runs fn with a context that ends when the server stops.
func (s *Server) spawnCtx(fn func(ctx context.Context)) {
	s.spawn(func() {
		ctx, cancel := stopContext(s.stop)
		defer cancel()
		fn(ctx)
	})
}

// stopContext is a context cancelled when stop closes (or cancel is called).
func stopContext(stop <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// proposeLessorCommands feeds the lessor's expirations and checkpoints to raft, off the Ready loop.
func (s *Server) proposeLessorCommands() {
	p := &lessorProposer{raft: s.node.raft, proposals: s.node.proposals, timeout: s.cfg.ProposalTimeout, log: s.log}
	for {
		select {
		case <-s.stop:
			return
		case cmd := <-s.lessorOut:
			p.proposeAsync(cmd)
		}
	}
}

// Done is closed when the node stops serving: Close, or a fatal error — a failed raft log write, or one
// stalled beyond Config.DiskStallTimeout (ErrDiskStalled; the stalled write may still be blocked, and Close
// then waits for it).
func (s *Server) Done() <-chan struct{} { return s.node.raft.Done() }

// Err is the fatal error that stopped the node, if any.
func (s *Server) Err() error { return s.node.raft.Err() }

// Close stops the node: it stops taking requests, hands leadership to a follower if it leads, stops raft
// and closes the data dir. It waits for every goroutine the server started.
func (s *Server) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.shutdown() })
	return s.closeErr
}

func (s *Server) shutdown() error {
	close(s.node.draining) // Writes streams tell their clients to close them
	s.node.watch.CloseAll()
	if s.health != nil {
		s.health.Shutdown() // NOT_SERVING from now on: balancers move away while the node drains
	}
	if s.gateway != nil {
		s.gateway.Close()
	}
	if s.clientSrv != nil {
		stopGRPC(s.clientSrv, 2*time.Second)
	}
	s.transferLeadership()
	s.node.raft.Stop()
	close(s.stop)
	if s.peerSrv != nil {
		s.peerSrv.Stop()
	}
	s.wg.Wait()
	var err, gerr error
	if s.gossip != nil {
		gerr = s.gossip.Close() // leaves the pool: the others forget this node at once
	}
	if s.transport != nil {
		err = s.transport.Close()
	}
	return errors.Join(err, gerr, s.node.storage.Close())
}

// stopGRPC drains in-flight calls for a while, then cuts long-lived streams (KeepAlive never ends by itself).
func stopGRPC(srv *grpc.Server, grace time.Duration) {
	done := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(grace):
		srv.Stop()
		<-done
	}
}

// transferLeadership hands leadership to the most caught-up follower and waits, briefly, for it to take
// over, so that clients see a fast failover rather than an election timeout.
func (s *Server) transferLeadership() {
	n := s.node
	if !n.raft.IsLeader() || n.raft.Err() != nil { // a node that cannot persist hands nothing over
		return
	}
	st := n.raft.Status()
	var target, best uint64
	for id, pr := range st.Progress {
		if id != n.id && pr.Match >= best && !pr.IsLearner {
			target, best = id, pr.Match
		}
	}
	if target == 0 {
		return
	}
	n.log.Info("transferring leadership before shutdown", "to", leasepb.FormatID(target))
	ctx, cancel := context.WithTimeout(context.Background(), n.cfg.ElectionTimeout())
	defer cancel()
	n.raft.TransferLeadership(ctx, n.id, target)
	ticker := time.NewTicker(n.cfg.TickInterval)
	defer ticker.Stop()
	for n.raft.IsLeader() {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// ClientAddr is the address the Leases and Cluster services listen on.
func (s *Server) ClientAddr() string { return s.cfg.ClientAddr }

// HTTPAddr is the address the HTTP/JSON API listens on; empty when it is off.
func (s *Server) HTTPAddr() string { return s.cfg.HTTPAddr }

// PeerAddr is the address raft traffic listens on.
func (s *Server) PeerAddr() string { return s.cfg.PeerAddr }

// ID is the node's raft id.
func (s *Server) ID() uint64 { return s.node.id }

// IsLeader reports whether this node currently leads.
func (s *Server) IsLeader() bool { return s.node.raft.IsLeader() }

// Leader is the raft id of the leader this node knows of (0: none; also while this node leads but its
// loop has stalled for an election timeout).
func (s *Server) Leader() uint64 { return s.node.raft.KnownLeader() }

// Watchers is how many Watch streams this node currently serves (leased_watchers).
func (s *Server) Watchers() int { return s.node.watch.Len() }

// Quota is the state size counted against Limits.QuotaBytes, and the quota: at or past it, grants of
// free resources are refused (internal/leases/quota.go).
func (s *Server) Quota() (used, quota int64) {
	return s.node.state.UsedBytes(), s.cfg.Limits.QuotaBytes
}

// AppliedIndex is the index of the last entry applied to this node's state machine.
func (s *Server) AppliedIndex() uint64 { return s.node.state.Applied() }

// raftAdapter lets the transport hand messages and delivery reports to raft.
type raftAdapter struct{ n *node }

func (a raftAdapter) Process(ctx context.Context, m *raftpb.Message) error {
	return a.n.raft.StepPeer(ctx, m)
}
func (a raftAdapter) ReportUnreachable(id uint64) { a.n.raft.ReportUnreachable(id) }
func (a raftAdapter) ReportSnapshot(id uint64, st raft.SnapshotStatus) {
	a.n.raft.ReportSnapshot(id, st)
}
