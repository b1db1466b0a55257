package server

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leased/leased/api/acl"
	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server/internal/lessor"
	"github.com/leased/leased/server/internal/membership"
	"github.com/leased/leased/server/internal/rpc"
)

// Config is everything a node needs. Only cmd/leased parses flags; tests build a Config directly.
type Config struct {
	// Name identifies the node in InitialCluster; its raft id is derived from it.
	Name string
	// DataDir holds the raft log (raft.db). A data dir belongs to one cluster and one node for life.
	DataDir string
	// ClientAddr serves the Leases and Cluster services; PeerAddr serves raft traffic. Use port 0 in tests.
	ClientAddr string
	PeerAddr   string
	// HTTPAddr, when set, serves the Leases service as HTTP/JSON (docs/http.md), with ClientTLS and
	// ClientCertAuth as on ClientAddr. Empty turns it off.
	HTTPAddr string
	// AdvertiseClientAddr and AdvertisePeerAddr are the addresses other nodes and clients reach this node
	// at (in the member table, leader hints and Status). Empty means the listen address, which must then
	// name a host: a node listening on 0.0.0.0 or [::] must be told what to advertise.
	AdvertiseClientAddr string
	AdvertisePeerAddr   string
	// InitialCluster lists every founding member (name -> peer address). It fixes the cluster id, so every
	// founding node must be given the same list. It is read only on a node's first start: from then on the
	// member table in the replicated state is the authority (decision 11). With InitialClusterState
	// "existing" it instead lists (some of) the current members, whom the new node asks for the cluster.
	InitialCluster map[string]string
	// InitialClusterState is "new" (found a cluster from InitialCluster; the default when empty) or
	// "existing" (join a running cluster that already added this node with MemberAdd). Only a node's first
	// start reads it.
	InitialClusterState string
	// GossipAddr, when set, runs memberlist gossip on it (server/internal/membership/gossip.go): nodes gossip their name, ids,
	// advertised addresses, version and whether they know a leader. AdvertiseGossipAddr is where the others
	// reach it (default GossipAddr, which must then name a host). Join lists gossip addresses (host:port)
	// to join; a new member with InitialClusterState "existing" finds the cluster through them, with no
	// InitialCluster needed. GossipKey (16, 24 or 32 bytes; ParseGossipKey) encrypts gossip. Gossip never
	// changes who votes (decision 7).
	GossipAddr          string
	AdvertiseGossipAddr string
	Join                []string
	GossipKey           []byte
	// InsecureGossip allows unencrypted gossip (no GossipKey) on an address other than loopback. Anyone
	// who reaches such a gossip port can join the pool and gossip made-up metadata, so that is refused
	// unless this says the network itself is trusted; the node then logs a warning at every start.
	InsecureGossip bool
	// InitialClusterToken names the cluster (etcd's --initial-cluster-token). A founding node derives the
	// cluster id from it (instead of from InitialCluster), so the id records it; a joining node accepts
	// only a cluster whose id its own token gives, whoever answers (a rogue gossip member included).
	// Joining through unencrypted gossip needs it. Only a node's first start reads it.
	InitialClusterToken string
	// JoinTimeout bounds how long a joining node's first start waits for a member to answer. 0: 1 minute.
	JoinTimeout time.Duration
	// AutoRejoin: a node starting on an empty data dir whose cluster knows it as a member that has run (its
	// data dir was lost) asks to be added again as a learner under a new raft id, its old id retired,
	// instead of refusing to start with ErrWipedMember (server/discover.go). For StatefulSets and other
	// supervisors that restart a node with its founding flags after its volume is lost.
	AutoRejoin bool

	// TickInterval is the raft tick; ElectionTicks and HeartbeatTicks are counted in ticks.
	TickInterval   time.Duration
	ElectionTicks  int
	HeartbeatTicks int
	// SnapshotEntries is how many applied entries trigger a snapshot and log compaction; SnapshotCatchUp
	// entries are kept after compaction so slightly slow followers catch up without a snapshot.
	SnapshotEntries uint64
	SnapshotCatchUp uint64

	// CheckpointInterval is how often the leader checkpoints each lease's remaining TTL (decision 3).
	CheckpointInterval time.Duration
	// ExpiryBatch caps the leases expired by one log entry.
	ExpiryBatch int
	// ExpiryRate caps the leases per second the leader proposes to expire (a burst of a tenth of a second's
	// worth, at least one batch). A mass disconnect expires hundreds of thousands of leases at once; every
	// node applies their expiries, and without a cap one Ready's apply held each node's loop (ticks,
	// heartbeats, every client's write) for most of a second (internal/lessor, "expiry rate").
	ExpiryRate int
	// WatchHistory is how many events are kept for Watch to resume from, and WatchHistoryBytes how many
	// bytes of them (internal/watch, eventBytes): the history stops at whichever is reached first, except that
	// the newest entry's events are always kept.
	WatchHistory      int
	WatchHistoryBytes int64
	// ProposalTimeout bounds how long a write waits for its entry to apply.
	ProposalTimeout time.Duration
	// DiskStallTimeout is how long one raft log write (a Save, a snapshot, a compaction) may take before
	// the node gives up on its disk and stops (fail-stop, decision 13): it fails its waiting requests, stops
	// serving, and Server.Done closes with ErrDiskStalled. It bounds the age of the write in flight, not
	// the disk's throughput: a slow disk whose writes each finish in time never trips it. At least twice
	// the election timeout.
	DiskStallTimeout time.Duration

	// KeepAliveTime is how long a client connection may be idle before the node pings it, and
	// KeepAliveTimeout how long it then waits for the answer before closing the connection: the streams of
	// a client that vanished (a crashed host, a black-holed link) end within their sum. KeepAliveMinTime
	// is the shortest interval at which a client may ping (with or without streams); a client that pings
	// more often is disconnected (GOAWAY "too_many_pings"). docs/operations.md ("Keepalive").
	KeepAliveTime    time.Duration
	KeepAliveTimeout time.Duration
	KeepAliveMinTime time.Duration

	// ClientTLS, when set, serves the client port over TLS; with ClientCertAuth it must also require and
	// verify client certificates, and a request's identity is its certificate's (docs/security.md).
	// PeerTLS, when set, is mutual TLS on the peer port. nil is plaintext. cmd/leased builds both from
	// certificate files that it re-reads when they change.
	ClientTLS      *tls.Config
	ClientCertAuth bool
	PeerTLS        *tls.Config
	// InsecurePeer allows a plaintext peer port on an address other than loopback. Without PeerTLS
	// anyone who reaches the peer port can forge raft messages and forwarded requests (docs/security.md),
	// so that is refused unless this says the network itself is trusted; the node then logs a warning at
	// every start.
	InsecurePeer bool
	// PeerCertAllowedCNs and PeerCertAllowedHostnames, when not empty, narrow which certificates chaining
	// to the peer CA are member credentials (etcd's --peer-cert-allowed-cn and --peer-cert-allowed-hostname):
	// the CN must be one of the first, and the certificate valid for one of the second. A peer certificate
	// must in any case list both the serverAuth and clientAuth extended key usages and name a member
	// (docs/security.md, "Peer threat model").
	PeerCertAllowedCNs       []string
	PeerCertAllowedHostnames []string

	// InitialACL is the ACL a new cluster starts with (--initial-acl-file; nil: none). A leader that finds
	// no rules ever set in the replicated state proposes it; once any rules are set (even none, by AclSet)
	// it is ignored for good. It matters only with ClientCertAuth (docs/security.md, "Identities and ACLs").
	InitialACL []*leasepb.AclRule

	Limits Limits

	// Logger receives the node's logs; nil discards them.
	Logger *slog.Logger
	// AuditLog receives the audit trail (docs/operations.md, "Audit trail"); nil means Logger. Its level decides what is
	// written: info for the leader's lines, debug for every node's, above info nothing.
	AuditLog *slog.Logger
	// Registerer receives the node's metrics; nil registers nowhere.
	Registerer prometheus.Registerer
	// Clock is the monotonic clock the lessor uses; nil means the real one.
	Clock Clock
	// Version is reported by Status.
	Version string

	// belowTTLFloor lets a test accept TTLs below TTLFloor, to isolate a mechanism that only matters there
	// (TestSimStalledLeaderDoesNotMassExpire); no flag or exported field sets it.
	belowTTLFloor bool
}

// maxStoredDuration is the longest TTL or lock-delay a lease stores (fsm.MaxDurationMs: 24.8 days); the
// limits may not allow more.
const maxStoredDuration = fsm.MaxDurationMs * time.Millisecond

// Limits are enforced at the edge, before anything is proposed (internal/rpc, where each field is
// documented). docs/design.md ("Limits") documents the defaults.
type Limits = rpc.Limits

// DefaultLimits are the documented defaults.
func DefaultLimits() Limits {
	return Limits{
		MaxResourceBytes:   256,
		MaxHolderBytes:     128,
		MaxValueBytes:      4096,
		MaxRequestIDBytes:  64,
		MinTTL:             0, // the TTL floor of the election timeout
		MaxTTL:             time.Hour,
		MaxLockDelay:       time.Minute,
		MaxLeasesPerHolder: 10_000,
		MaxRequestBytes:    4 << 20,
		MaxKeepAliveLeases: 10_000,
		MaxListLimit:       1000,

		MaxWatchers:           10_000,
		MaxWatchersPerConn:    1000,
		MaxWaiters:            10_000,
		MaxWaitersPerResource: 1000,
		MaxStreamsPerConn:     1000,
		MaxLeases:             1_000_000,
		QuotaBytes:            512 << 20,
		MaxConnectionIdle:     2 * time.Minute,
	}
}

// DefaultConfig is a production configuration, less the node-specific fields.
func DefaultConfig() Config {
	return Config{
		TickInterval:       100 * time.Millisecond,
		ElectionTicks:      10,
		HeartbeatTicks:     1,
		SnapshotEntries:    100_000,
		SnapshotCatchUp:    10_000,
		CheckpointInterval: 5 * time.Second,
		ExpiryBatch:        1000,
		ExpiryRate:         50_000,
		WatchHistory:       100_000,
		WatchHistoryBytes:  64 << 20,
		ProposalTimeout:    5 * time.Second,
		JoinTimeout:        time.Minute,
		DiskStallTimeout:   10 * time.Second,
		KeepAliveTime:      10 * time.Second,
		KeepAliveTimeout:   5 * time.Second,
		KeepAliveMinTime:   5 * time.Second,
		Limits:             DefaultLimits(),
	}
}

// TestConfig has fast ticks and small snapshot intervals, for in-process clusters in tests. Its election
// timeout is 100 ms (10 ticks of 10 ms: shorter makes leaders churn on a loaded machine under the race
// detector), so its TTL floor (the shortest TTL it accepts) is 800 ms.
func TestConfig() Config {
	c := DefaultConfig()
	c.TickInterval = 10 * time.Millisecond
	c.SnapshotEntries = 200
	c.SnapshotCatchUp = 20
	c.CheckpointInterval = 200 * time.Millisecond
	c.ProposalTimeout = 3 * time.Second
	return c
}

// The values of Config.InitialClusterState.
const (
	ClusterStateNew      = "new"
	ClusterStateExisting = "existing"
)

// unspecifiedHost reports whether addr's host is empty, 0.0.0.0 or :: (every interface), which nobody can
// dial. An address that does not parse is left to the listener to refuse.
func unspecifiedHost(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsUnspecified()
}

func (c Config) joinTimeout() time.Duration {
	if c.JoinTimeout == 0 {
		return time.Minute
	}
	return c.JoinTimeout
}

// ElectionTimeout is the time without a leader after which a follower campaigns.
func (c Config) ElectionTimeout() time.Duration {
	return time.Duration(c.ElectionTicks) * c.TickInterval
}

// TTLFloor is the shortest TTL this configuration accepts (docs/operations.md, "TTL floor"): a lease
// whose holder keeps renewing must outlast one leader crash or freeze. The SDK renews every TTL/3 and
// abandons a renewal unanswered for TTL/6, so counted from its last acknowledged renewal a holder has
// TTL/2 to reach a new leader and renew. A failover takes up to 2 × the election timeout (raft
// randomizes it) plus the new leader's first commit and the holder's discovery and ReadIndex, about
// 2.5 × in all; floorElections = 8 makes TTL/2 = 4 × the election timeout, leaving 1.5 × of slack for
// scheduling delay and clock drift (with 5 ×, the earlier floor, a 30-minute soak lost 0.3 % of the
// leases at the floor). 8 s with the defaults, where Consul's minimum session TTL is 10 s.
func (c Config) TTLFloor() time.Duration {
	return floorElections * c.ElectionTimeout()
}

// floorElections is TTLFloor in election timeouts.
const floorElections = 8

// minTTL is the shortest TTL the edge accepts: Limits.MinTTL, or the floor when that is 0.
func (c Config) minTTL() time.Duration {
	if c.Limits.MinTTL == 0 {
		return c.TTLFloor()
	}
	return c.Limits.MinTTL
}

// limits are the Limits the edge enforces: MinTTL resolved, and the reason for it ready for the answer.
func (c Config) limits() Limits {
	l := c.Limits
	l.MinTTL = c.minTTL()
	l.MaxLeasesPerIdentity = orFraction(l.MaxLeasesPerIdentity, l.MaxLeases)
	l.MaxWatchersPerIdentity = orFraction(l.MaxWatchersPerIdentity, l.MaxWatchers)
	l.MaxWaitersPerIdentity = orFraction(l.MaxWaitersPerIdentity, l.MaxWaiters)
	if l.QuotaBytesPerIdentity == 0 {
		l.QuotaBytesPerIdentity = max(1, l.QuotaBytes/identityShare)
	}
	if l.MaxConnections == 0 {
		l.MaxConnections = rpc.DefaultMaxConnections()
	}
	floor := c.TTLFloor()
	switch {
	case l.MinTTL == floor:
		return rpc.ExplainMinTTL(l, fmt.Sprintf("the TTL must outlast a leader failover: %d × the %v election timeout", floorElections, c.ElectionTimeout()))
	case l.MinTTL > floor:
		return rpc.ExplainMinTTL(l, fmt.Sprintf("the configured minimum; the floor, for a TTL to outlast a leader failover, is %v", floor))
	default:
		return rpc.ExplainMinTTL(l, fmt.Sprintf("a test configuration below the failover floor %v", floor))
	}
}

// identityShare is the share of a node or cluster limit one identity may use by default: a quarter, so
// that it takes four identities at their limits to fill the whole, and one at its limit leaves the rest
// three quarters.
const identityShare = 4

// orFraction is v, or when v is 0 the identity's default share of total (at least 1).
func orFraction(v, total int) int {
	if v != 0 {
		return v
	}
	return max(1, total/identityShare)
}

// Validate reports every problem with the configuration at once.
func (c Config) Validate() error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(c.Name != "", "name is required")
	check(c.DataDir != "", "data dir is required")
	check(c.ClientAddr != "", "client address is required")
	check(c.PeerAddr != "", "peer address is required")
	check(c.AdvertiseClientAddr != "" || !unspecifiedHost(c.ClientAddr), "client address %s listens on every interface, "+
		"which clients cannot dial: give an advertise client address", c.ClientAddr)
	check(c.AdvertisePeerAddr != "" || !unspecifiedHost(c.PeerAddr), "peer address %s listens on every interface, "+
		"which peers cannot dial: give an advertise peer address", c.PeerAddr)
	check(c.GossipAddr == "" || c.AdvertiseGossipAddr != "" || !unspecifiedHost(c.GossipAddr), "gossip address %s listens on every interface, "+
		"which other nodes cannot reach: give an advertise gossip address", c.GossipAddr)
	check(len(c.Join) == 0 || c.GossipAddr != "", "joining gossip members needs a gossip address of this node")
	for _, j := range c.Join {
		check(membership.ValidAdvertise(j), "join address %q must be host:port", j)
	}
	check(len(c.GossipKey) == 0 || len(c.GossipKey) == 16 || len(c.GossipKey) == 24 || len(c.GossipKey) == 32,
		"gossip key is %d bytes; it must be 16, 24 or 32", len(c.GossipKey))
	check(c.GossipAddr == "" || len(c.GossipKey) > 0 || c.InsecureGossip || isLoopback(c.GossipAddr), "gossip address %s is not loopback "+
		"and gossip is not encrypted: anyone who reaches it could join the pool and gossip false addresses; give --gossip-key-file, "+
		"or --insecure-gossip on a network you trust", c.GossipAddr)
	check(c.InitialClusterState != ClusterStateExisting || len(c.Join) == 0 || len(c.GossipKey) > 0 || c.InitialClusterToken != "",
		"joining through unencrypted gossip needs --initial-cluster-token (the cluster's), so that a gossip member cannot hand this "+
			"node another cluster; or give --gossip-key-file")
	for _, a := range []string{c.AdvertiseClientAddr, c.AdvertisePeerAddr, c.AdvertiseGossipAddr} {
		check(a == "" || membership.ValidAdvertise(a), "advertise address %q must be host:port with a host that is not 0.0.0.0 or [::]", a)
	}
	_, inCluster := c.InitialCluster[c.Name]
	check(len(c.InitialCluster) == 0 || inCluster || c.InitialClusterState == ClusterStateExisting,
		"initial cluster does not name this node (%q)", c.Name)
	check(c.InitialClusterState == "" || c.InitialClusterState == ClusterStateNew || c.InitialClusterState == ClusterStateExisting,
		"initial cluster state %q must be %q or %q", c.InitialClusterState, ClusterStateNew, ClusterStateExisting)
	check(c.JoinTimeout >= 0, "join timeout must not be negative")
	check(c.TickInterval > 0, "tick interval must be positive")
	check(c.HeartbeatTicks > 0 && c.ElectionTicks > 2*c.HeartbeatTicks, "election ticks (%d) must exceed twice the heartbeat ticks (%d)", c.ElectionTicks, c.HeartbeatTicks)
	check(c.SnapshotEntries > 0, "snapshot entries must be positive")
	check(c.CheckpointInterval > 0, "checkpoint interval must be positive")
	check(c.ExpiryBatch > 0, "expiry batch must be positive")
	check(c.ExpiryRate > 0, "expiry rate must be positive")
	check(c.WatchHistory > 0 && c.WatchHistoryBytes > 0, "watch history (events and bytes) must be positive")
	check(c.ProposalTimeout > 0, "proposal timeout must be positive")
	check(c.DiskStallTimeout >= 2*c.ElectionTimeout(), "disk stall timeout (%v) must be at least twice the election timeout (%v): "+
		"a node must not stop for a stall the cluster rides out without electing another leader", c.DiskStallTimeout, c.ElectionTimeout())
	check(c.KeepAliveTime > 0 && c.KeepAliveTimeout > 0 && c.KeepAliveMinTime > 0, "keepalive time, timeout and min time must be positive")
	check(!c.ClientCertAuth || (c.ClientTLS != nil && c.ClientTLS.ClientAuth == tls.RequireAndVerifyClientCert),
		"client certificate auth needs client TLS that requires and verifies client certificates (--cert-file, --key-file, --trusted-ca-file)")
	check(c.PeerTLS != nil || c.InsecurePeer || isLoopback(c.PeerAddr), "peer address %s is not loopback and peer TLS is off: "+
		"anyone who reaches it could forge raft messages; give --peer-cert-file, --peer-key-file and --peer-trusted-ca-file, "+
		"or --insecure-peer on a network you trust", c.PeerAddr)
	l := c.Limits
	check(l.MinTTL >= 0, "min TTL must not be negative")
	check(l.MinTTL == 0 || l.MinTTL >= c.TTLFloor() || c.belowTTLFloor, "min TTL %v is below the TTL floor %v: a lease must outlast a leader failover "+
		"(%d × the %v election timeout); leave it 0 for the floor", l.MinTTL, c.TTLFloor(), floorElections, c.ElectionTimeout())
	check(l.MaxTTL >= c.minTTL(), "TTL range %v..%v is empty", c.minTTL(), l.MaxTTL)
	check(l.MaxResourceBytes > 0 && l.MaxHolderBytes > 0 && l.MaxValueBytes >= 0 && l.MaxRequestIDBytes > 0, "name and value limits must be positive")
	check(l.MaxLeasesPerHolder > 0 && l.MaxKeepAliveLeases > 0 && l.MaxListLimit > 0 && l.MaxRequestBytes > 0, "count limits must be positive")
	check(l.MaxLockDelay >= 0, "max lock delay must not be negative")
	check(l.MaxTTL <= maxStoredDuration && l.MaxLockDelay <= maxStoredDuration,
		"max TTL %v and max lock delay %v must not exceed %v: a lease stores them as 32-bit milliseconds",
		l.MaxTTL, l.MaxLockDelay, maxStoredDuration)
	check(l.MaxWatchers > 0 && l.MaxWatchersPerConn > 0 && l.MaxWaiters > 0 && l.MaxWaitersPerResource > 0 &&
		l.MaxStreamsPerConn > 0 && l.MaxLeases > 0 && l.QuotaBytes > 0, "watcher, waiter, stream, lease and quota limits must be positive")
	check(l.MaxLeasesPerIdentity >= 0 && l.MaxWatchersPerIdentity >= 0 && l.MaxWaitersPerIdentity >= 0 && l.QuotaBytesPerIdentity >= 0 && l.MaxConnections >= 0,
		"per-identity and connection limits must not be negative (0: the default)")
	check(l.MaxConnectionIdle > 0, "max connection idle must be positive")
	check(l.MaxLeasesPerIdentity <= math.MaxUint32 && l.MaxLeasesPerHolder <= math.MaxUint32, "lease count limits must fit in 32 bits")
	if err := acl.Validate(c.InitialACL); err != nil {
		errs = append(errs, fmt.Errorf("initial ACL: %w", err))
	}
	if len(errs) > 0 {
		return fmt.Errorf("invalid config: %w", errors.Join(errs...))
	}
	return nil
}

// isLoopback reports whether a listen address (host:port) only accepts connections from this machine.
// An empty host listens on every interface.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// lessorConfig is what the lessor takes of c: an expiry or checkpoint not applied within two election
// timeouts is proposed again.
func lessorConfig(c Config) lessor.Config {
	return lessor.Config{CheckpointInterval: c.CheckpointInterval, Retry: 2 * c.ElectionTimeout(),
		ExpiryBatch: c.ExpiryBatch, ExpiryRate: c.ExpiryRate}
}
