package server

import (
	"errors"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server/internal/leases"
	"github.com/leased/leased/server/internal/raftnode"
)

// metrics are the node's Prometheus metrics: each part registers its own (the Ready loop's
// raftnode.Metrics, the request path's rpc.Metrics, the state's leases.Metrics, the lessor's, the
// queue's and the watch hub's); these are the rest, the proposals both the loop and the request path
// count, the peer links', readiness, the disk and the build, and together they are exactly the node series of the
// metrics contract (docs/operations.md, "Metrics", lists them). Names follow leased_<name>_<unit>; no lease, holder or
// resource name is ever a label value, and every label value is set up front, so each series exists, at
// 0, from the start. They are registered on Config.Registerer (nowhere when it is nil), never in init();
// a Registerer serves one Server.
type metrics struct {
	leases       *leases.Metrics
	proposals    *prometheus.CounterVec   // by outcome
	peerRTT      *prometheus.HistogramVec // by peer
	peerFailures *prometheus.CounterVec   // by peer
	peerRejects  *prometheus.CounterVec   // by reason
}

// Label values, all of them set up front.
var (
	proposalOutcomes = []string{outcomeApplied, outcomeFailed, outcomeTimedOut, outcomeRefused}
)

const (
	outcomeApplied  = "applied"
	outcomeFailed   = "failed"
	outcomeTimedOut = "timed_out"
	outcomeRefused  = "refused"
)

// latencyBuckets span 100 µs to ~3 s: round trips (as raftnode's do its disk writes and rounds).
var latencyBuckets = prometheus.ExponentialBuckets(0.0001, 2, 16)

// newMetrics makes n's metrics and registers them, and those of n's state, lessor, queue and watch hub,
// on reg (nowhere when it is nil).
func newMetrics(reg prometheus.Registerer, n *node) *metrics {
	n.lessor.RegisterMetrics(reg)
	m := &metrics{
		leases: leases.NewMetrics(reg, n.state),
		proposals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leased_proposals_total", Help: "Client commands this node proposed, by outcome (refused: rejected before proposing).",
		}, []string{"outcome"}),
		peerRTT: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "leased_peer_round_trip_seconds", Help: "Round-trip time to a peer (heartbeat to its response).",
			Buckets: latencyBuckets,
		}, []string{"peer"}),
		peerFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leased_peer_send_failures_total", Help: "Raft messages to a peer that could not be sent (dropped, link error).",
		}, []string{"peer"}),
		peerRejects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leased_peer_messages_dropped_total",
			Help: "Raft messages received from peers and dropped before raft saw them, by reason (docs/security.md, \"Hostile peer input\").",
		}, []string{"reason"}),
	}
	for _, r := range raftnode.PeerDropReasons {
		m.peerRejects.WithLabelValues(r)
	}
	for _, o := range proposalOutcomes {
		m.proposals.WithLabelValues(o)
	}
	if reg == nil {
		return m
	}
	n.queue.RegisterMetrics(reg)
	n.watch.RegisterMetrics(reg)
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
	}
	reg.MustRegister(m.proposals,
		m.peerRTT, m.peerFailures, m.peerRejects, buildInfo(n.cfg.Version),
		gauge("leased_ready", "1 while this node is ready (/readyz's rule): it knows a leader and its raft loop runs.", func() float64 { return boolFloat(readiness(n) == nil) }),
		gauge("leased_disk_free_bytes", "Bytes still free for leased on the data dir's filesystem (-1: unknown).", func() float64 { return float64(n.disk.freeBytes.Load()) }),
		gauge("leased_db_size_bytes", "Bytes the raft log occupies on disk: raft.db plus the WAL segments (preallocated space included).", func() float64 { return float64(n.disk.logBytes.Load()) }),
	)
	return m
}

// buildInfo is leased_build_info: 1, labelled with the binary's version (Config.Version, which leased
// sets to what --version prints; else the module version, "(devel)" when unknown), VCS revision
// ("unknown" when not stamped) and Go version.
func buildInfo(configured string) prometheus.Collector {
	version, revision, goversion := "(devel)", "unknown", runtime.Version()
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v := bi.Main.Version; v != "" {
			version = v
		}
		if bi.GoVersion != "" {
			goversion = bi.GoVersion
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && s.Value != "" {
				revision = s.Value
			}
		}
	}
	if configured != "" {
		version = configured
	}
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "leased_build_info", Help: "The build of this binary (always 1).",
	}, []string{"version", "revision", "goversion"})
	g.WithLabelValues(version, revision, goversion).Set(1)
	return g
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// proposed counts one proposal's outcome. entered reports whether the command may have entered the log.
func (m *metrics) proposed(entered bool, err error) {
	m.proposals.WithLabelValues(outcomeLabel(entered, err)).Inc()
}

func outcomeLabel(entered bool, err error) string {
	switch {
	case err == nil:
		return outcomeApplied
	case errors.Is(err, ErrTimeout):
		return outcomeTimedOut
	case !entered:
		return outcomeRefused
	default:
		return outcomeFailed
	}
}

// addPeer sets up a peer's series (at 0).
func (m *metrics) addPeer(id uint64) {
	m.peerRTT.WithLabelValues(leasepb.FormatID(id))
	m.peerFailures.WithLabelValues(leasepb.FormatID(id))
}

// removePeer drops a removed member's series.
func (m *metrics) removePeer(id uint64) {
	m.peerRTT.DeleteLabelValues(leasepb.FormatID(id))
	m.peerFailures.DeleteLabelValues(leasepb.FormatID(id))
}

// peerRoundTrip and peerDropped are the transport's per-peer hooks (transport.Config.OnRoundTrip,
// OnDropped).
func (m *metrics) peerRoundTrip(id uint64, d time.Duration) {
	m.peerRTT.WithLabelValues(leasepb.FormatID(id)).Observe(d.Seconds())
}

func (m *metrics) peerDropped(id uint64, count int) {
	m.peerFailures.WithLabelValues(leasepb.FormatID(id)).Add(float64(count))
}

// peerRejected counts inbound peer messages dropped for reason (raftnode's peer checks, and the
// transport's OnRejected).
func (m *metrics) peerRejected(reason string, count int) {
	m.peerRejects.WithLabelValues(reason).Add(float64(count))
}
