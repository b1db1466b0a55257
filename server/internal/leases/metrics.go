package leases

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/fsm"
)

// Metrics are the state's series of the metrics contract (docs/operations.md, "Metrics"): the lease
// events applied, and gauges read from the State as they are scraped.
type Metrics struct {
	events *prometheus.CounterVec // by event type
}

var eventTypeLabel = map[leasepb.EventType]string{
	leasepb.EventType_EVENT_TYPE_GRANTED:       "granted",
	leasepb.EventType_EVENT_TYPE_RELEASED:      "released",
	leasepb.EventType_EVENT_TYPE_EXPIRED:       "expired",
	leasepb.EventType_EVENT_TYPE_VALUE_CHANGED: "value_changed",
}

// NewMetrics makes s's metrics and registers them on reg (nowhere when it is nil). Every label value is
// set up front, so each series exists, at 0, from the start.
func NewMetrics(reg prometheus.Registerer, s *State) *Metrics {
	m := &Metrics{events: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "leased_events_total", Help: "Lease events applied to this node's state machine, by type.",
	}, []string{"type"})}
	for _, t := range eventTypeLabel {
		m.events.WithLabelValues(t)
	}
	if reg == nil {
		return m
	}
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
	}
	reg.MustRegister(m.events,
		gauge("leased_applied_index", "The index of the last entry applied.", func() float64 { return float64(s.Applied()) }),
		gauge("leased_live_leases", "Live leases in this node's state machine.", func() float64 {
			live := 0
			s.Read(func(sm *fsm.FSM) { live = sm.Len() })
			return float64(live)
		}),
		gauge("leased_quota_bytes", "The state size at which new grants are refused (--quota-bytes).", func() float64 { return float64(s.cfg.Limits.QuotaBytes) }),
		gauge("leased_quota_used_bytes", "The state size counted against --quota-bytes: live leases and lock-delays.", func() float64 { return float64(s.UsedBytes()) }),
		gauge("leased_quota_exceeded", "1 while the state is at or past --quota-bytes and new grants are refused (NOSPACE).", func() float64 {
			if s.QuotaFull() {
				return 1
			}
			return 0
		}),
	)
	return m
}

// Applied counts the grants, releases and expiries of an applied entry (Config.Metrics).
func (m *Metrics) Applied(res fsm.Result) {
	for _, e := range res.Events {
		m.events.WithLabelValues(eventTypeLabel[e.Type]).Inc()
	}
}
