package server

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leased/leased/api/acl"
	"github.com/leased/leased/api/leasepb"
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
	// InitialCluster lists every founding member (name -> peer address). It fixes the cluster id, so every
	// founding node must be given the same list.
	InitialCluster map[string]string

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
	// WatchHistory is how many events are kept for Watch to resume from.
	WatchHistory int
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

	// InitialACL is the ACL a new cluster starts with (--initial-acl-file; nil: none). A leader that finds
	// no rules ever set in the replicated state proposes it; once any rules are set (even none, by AclSet)
	// it is ignored for good. It matters only with ClientCertAuth (docs/security.md, "Identities and ACLs").
	InitialACL []*leasepb.AclRule

	Limits Limits

	// Logger receives the node's logs; nil discards them.
	Logger *slog.Logger
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

// Limits are enforced at the edge, before anything is proposed. docs/design.md ("Limits") documents the defaults.
type Limits struct {
	MaxResourceBytes  int
	MaxHolderBytes    int
	MaxValueBytes     int
	MaxRequestIDBytes int
	// MinTTL and MaxTTL bound the TTL an Acquire may ask for. MinTTL 0 means Config.TTLFloor; a MinTTL
	// below the floor is a configuration error.
	MinTTL, MaxTTL     time.Duration
	MaxLockDelay       time.Duration
	MaxLeasesPerHolder int
	// MaxRequestBytes is the largest gRPC message a client may send.
	MaxRequestBytes int
	// MaxKeepAliveLeases is the most leases one KeepAlive message may renew.
	MaxKeepAliveLeases int
	// MaxListLimit is the largest List page.
	MaxListLimit int

	// minTTLWhy explains MinTTL in the InvalidArgument answer to a shorter TTL (set by Config.limits).
	minTTLWhy string
}

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
		WatchHistory:       100_000,
		ProposalTimeout:    5 * time.Second,
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
// leases at the floor: docs/testing.md). 8 s with the defaults, where Consul's minimum session TTL is 10 s.
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
	floor := c.TTLFloor()
	switch {
	case l.MinTTL == floor:
		l.minTTLWhy = fmt.Sprintf("the TTL must outlast a leader failover: %d × the %v election timeout", floorElections, c.ElectionTimeout())
	case l.MinTTL > floor:
		l.minTTLWhy = fmt.Sprintf("the configured minimum; the floor, for a TTL to outlast a leader failover, is %v", floor)
	default:
		l.minTTLWhy = fmt.Sprintf("a test configuration below the failover floor %v", floor)
	}
	return l
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
	_, inCluster := c.InitialCluster[c.Name]
	check(len(c.InitialCluster) == 0 || inCluster, "initial cluster does not name this node (%q)", c.Name)
	check(c.TickInterval > 0, "tick interval must be positive")
	check(c.HeartbeatTicks > 0 && c.ElectionTicks > 2*c.HeartbeatTicks, "election ticks (%d) must exceed twice the heartbeat ticks (%d)", c.ElectionTicks, c.HeartbeatTicks)
	check(c.SnapshotEntries > 0, "snapshot entries must be positive")
	check(c.CheckpointInterval > 0, "checkpoint interval must be positive")
	check(c.ExpiryBatch > 0, "expiry batch must be positive")
	check(c.WatchHistory > 0, "watch history must be positive")
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
