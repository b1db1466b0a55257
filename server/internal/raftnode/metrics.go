package raftnode

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the Ready loop's series of the metrics contract (docs/operations.md, "Metrics"): its disk
// writes, applies, ReadIndex rounds, snapshots and leader changes.
type Metrics struct {
	leaderChanges prometheus.Counter
	// leaderStreamLost counts the times this follower's stream from its leader broke and it campaigned.
	leaderStreamLost prometheus.Counter
	fsyncSeconds     prometheus.Histogram
	applySeconds     prometheus.Histogram
	readSeconds      prometheus.Histogram
	snapSeconds      prometheus.Histogram
	snapBytes        prometheus.Gauge
	logEntries       prometheus.Gauge
}

// latencyBuckets span 100 µs to ~3 s: disk writes, applies, ReadIndex rounds, round trips.
var latencyBuckets = prometheus.ExponentialBuckets(0.0001, 2, 16)

// NewMetrics returns the loop's metrics, registered on reg (nowhere when it is nil).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	histogram := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
	}
	m := &Metrics{
		leaderChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leased_leader_changes_total", Help: "Leader changes this node saw (a new leader known; the first election counts).",
		}),
		leaderStreamLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leased_leader_stream_lost_total",
			Help: "Times this follower's raft stream from its leader broke (the leader's process or connection died) and it campaigned at once.",
		}),
		fsyncSeconds: histogram("leased_disk_fsync_duration_seconds",
			"Time of one durable raft log write (a Save: the WAL batch and the acked mark, each with its fdatasync).", latencyBuckets),
		applySeconds: histogram("leased_apply_duration_seconds",
			"Time to apply one Ready's committed entries to the state machine and its listeners.", latencyBuckets),
		readSeconds: histogram("leased_read_index_duration_seconds",
			"Time of one ReadIndex round (linearizable reads, renewals).", latencyBuckets),
		snapSeconds: histogram("leased_snapshot_duration_seconds",
			"Time to take a state machine snapshot and compact the raft log.", prometheus.ExponentialBuckets(0.001, 2, 16)),
		snapBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "leased_snapshot_size_bytes", Help: "Size of the last state machine snapshot.",
		}),
		logEntries: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "leased_raft_log_entries", Help: "Entries in the raft log not yet compacted.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.leaderChanges, m.leaderStreamLost, m.fsyncSeconds, m.applySeconds, m.readSeconds,
			m.snapSeconds, m.snapBytes, m.logEntries)
	}
	return m
}

// registerStatus registers the gauges of n's raft status on reg, read as they are scraped: whether it
// knows a leader and leads, its term and commit index, and how long its loop has stalled.
func registerStatus(reg prometheus.Registerer, n *Node) {
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
	}
	flag := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	reg.MustRegister(
		gauge("leased_has_leader", "1 while this node knows a leader (a leader whose loop has stalled for an election timeout knows none).", func() float64 { return flag(n.KnownLeader() != 0) }),
		gauge("leased_loop_stalled_seconds", "How long the raft loop has not run, once longer than an election timeout; 0 while it runs.", func() float64 { return n.LoopStalled().Seconds() }),
		gauge("leased_is_leader", "1 while this node leads.", func() float64 { return flag(n.IsLeader()) }),
		gauge("leased_term", "The node's current raft term.", func() float64 { return float64(n.Term()) }),
		gauge("leased_commit_index", "The node's raft commit index.", func() float64 { return float64(n.Commit()) }),
	)
}
