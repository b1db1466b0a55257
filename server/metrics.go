package server

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/fsm"
)

// metrics are the node's Prometheus metrics. Names follow leased_<subsystem>_<name>_<unit>; no lease,
// holder or resource name is ever a label value. They are registered on Config.Registerer (nowhere when it
// is nil), never in init().
type metrics struct {
	events        *prometheus.CounterVec // by event type
	proposals     *prometheus.CounterVec // by outcome
	renewals      *prometheus.CounterVec // by outcome
	leaderChanges prometheus.Counter
	saveSeconds   prometheus.Histogram
	readSeconds   prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer, n *node) *metrics {
	m := &metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leased_fsm_events_total", Help: "Lease events applied to this node's state machine, by type.",
		}, []string{"type"}),
		proposals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leased_server_proposals_total", Help: "Client commands proposed by this node, by outcome.",
		}, []string{"outcome"}),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leased_lessor_renewals_total", Help: "Lease renewals answered by this node as leader, by outcome.",
		}, []string{"outcome"}),
		leaderChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leased_raft_leader_changes_total", Help: "Times this node saw the leader change.",
		}),
		saveSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "leased_raftlog_save_seconds", Help: "Time to persist one Ready (one bbolt transaction, fsynced).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		readSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "leased_raft_read_index_seconds", Help: "Time for a ReadIndex round (linearizable reads, renewals).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
	}
	if reg == nil {
		return m
	}
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
	}
	reg.MustRegister(m.events, m.proposals, m.renewals, m.leaderChanges, m.saveSeconds, m.readSeconds,
		gauge("leased_raft_term", "The node's current raft term.", func() float64 { return float64(n.term.Load()) }),
		gauge("leased_raft_commit_index", "The node's commit index.", func() float64 { return float64(n.commit.Load()) }),
		gauge("leased_raft_applied_index", "The index of the last entry applied.", func() float64 { return float64(n.applied.Load()) }),
		gauge("leased_raft_is_leader", "1 while this node leads.", func() float64 { return boolFloat(n.isLeader()) }),
		gauge("leased_fsm_live_leases", "Live leases in this node's state machine.", func() float64 { return float64(n.liveLeases()) }),
		gauge("leased_raftlog_db_size_bytes", "Size of the raft log file.", func() float64 { return float64(n.storage.Size()) }),
	)
	return m
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

var eventTypeLabel = map[leasepb.EventType]string{
	leasepb.EventType_EVENT_TYPE_GRANTED:  "granted",
	leasepb.EventType_EVENT_TYPE_RELEASED: "released",
	leasepb.EventType_EVENT_TYPE_EXPIRED:  "expired",
}

// applied counts the grants, releases and expiries of an applied entry.
func (m *metrics) applied(res fsm.Result) {
	for _, e := range res.Events {
		m.events.WithLabelValues(eventTypeLabel[e.Type]).Inc()
	}
}

func (m *metrics) proposed(err error) {
	if err != nil {
		m.proposals.WithLabelValues("error").Inc()
		return
	}
	m.proposals.WithLabelValues("applied").Inc()
}

func (m *metrics) renewed(results []*leasepb.KeepAliveResult) {
	for _, r := range results {
		if r.GetGone() {
			m.renewals.WithLabelValues("gone").Inc()
		} else {
			m.renewals.WithLabelValues("renewed").Inc()
		}
	}
}

func since(start time.Time) float64 { return time.Since(start).Seconds() }
