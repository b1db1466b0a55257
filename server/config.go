package server

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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

	Limits Limits

	// Logger receives the node's logs; nil discards them.
	Logger *slog.Logger
	// Registerer receives the node's metrics; nil registers nowhere.
	Registerer prometheus.Registerer
	// Clock is the monotonic clock the lessor uses; nil means the real one.
	Clock Clock
	// Version is reported by Status.
	Version string
}

// Limits are enforced at the edge, before anything is proposed. docs/design.md ("Limits") documents the defaults.
type Limits struct {
	MaxResourceBytes   int
	MaxHolderBytes     int
	MaxValueBytes      int
	MaxRequestIDBytes  int
	MinTTL, MaxTTL     time.Duration
	MaxLockDelay       time.Duration
	MaxLeasesPerHolder int
	// MaxRequestBytes is the largest gRPC message a client may send.
	MaxRequestBytes int
	// MaxKeepAliveLeases is the most leases one KeepAlive message may renew.
	MaxKeepAliveLeases int
	// MaxListLimit is the largest List page.
	MaxListLimit int
}

// DefaultLimits are the documented defaults.
func DefaultLimits() Limits {
	return Limits{
		MaxResourceBytes:   256,
		MaxHolderBytes:     128,
		MaxValueBytes:      4096,
		MaxRequestIDBytes:  64,
		MinTTL:             time.Second,
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

// TestConfig has fast ticks and small snapshot intervals, for in-process clusters in tests.
func TestConfig() Config {
	c := DefaultConfig()
	c.TickInterval = 10 * time.Millisecond
	c.SnapshotEntries = 200
	c.SnapshotCatchUp = 20
	c.CheckpointInterval = 200 * time.Millisecond
	c.ProposalTimeout = 3 * time.Second
	c.Limits.MinTTL = 100 * time.Millisecond
	return c
}

// ElectionTimeout is the time without a leader after which a follower campaigns.
func (c Config) ElectionTimeout() time.Duration {
	return time.Duration(c.ElectionTicks) * c.TickInterval
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
	l := c.Limits
	check(l.MinTTL > 0 && l.MaxTTL >= l.MinTTL, "TTL range %v..%v is empty", l.MinTTL, l.MaxTTL)
	check(l.MaxResourceBytes > 0 && l.MaxHolderBytes > 0 && l.MaxValueBytes >= 0 && l.MaxRequestIDBytes > 0, "name and value limits must be positive")
	check(l.MaxLeasesPerHolder > 0 && l.MaxKeepAliveLeases > 0 && l.MaxListLimit > 0 && l.MaxRequestBytes > 0, "count limits must be positive")
	check(l.MaxLockDelay >= 0, "max lock delay must not be negative")
	if len(errs) > 0 {
		return fmt.Errorf("invalid config: %w", errors.Join(errs...))
	}
	return nil
}
