package rpc

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/leased/leased/api/leasepb"
)

// Metrics are the series only the request path counts (docs/operations.md, "Metrics", lists them with
// the node's others). Every label value is set up front, so each series exists, at 0, from the start.
type Metrics struct {
	renewals      *prometheus.CounterVec // by outcome
	openStreams   *prometheus.GaugeVec   // by kind
	keepAliveSize prometheus.Histogram
	batchSize     prometheus.Histogram
	// refusedProposals is leased_proposals_total{outcome="refused"}: the node counts the other outcomes
	// of the same series where it proposes.
	refusedProposals prometheus.Counter
}

// Label values, all of them set up front.
var (
	renewalOutcomes = []string{"renewed", "gone"}
	streamKinds     = []string{streamWatch, streamKeepAlive, streamWrites}
)

const (
	streamWatch     = "watch"
	streamKeepAlive = "keepalive"
	streamWrites    = "writes"
)

// NewMetrics makes the request path's metrics and registers them on reg (nowhere when it is nil).
// refused counts the writes refused before they could be proposed.
func NewMetrics(reg prometheus.Registerer, refused prometheus.Counter) *Metrics {
	histogram := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
	}
	m := &Metrics{
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leased_renewals_total", Help: "Lease renewals answered by this node as leader, by outcome.",
		}, []string{"outcome"}),
		openStreams: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "leased_open_streams", Help: "Server streams open on this node, by kind.",
		}, []string{"kind"}),
		keepAliveSize: histogram("leased_keepalive_batch_size",
			"Leases renewed per KeepAlive message.", prometheus.ExponentialBuckets(1, 4, 8)),
		batchSize: histogram("leased_batch_writes",
			"Writes per Writes stream request this node served (the SDK's coalesced quick writes).", prometheus.ExponentialBuckets(1, 2, 7)),
		refusedProposals: refused,
	}
	for _, o := range renewalOutcomes {
		m.renewals.WithLabelValues(o)
	}
	for _, k := range streamKinds {
		m.openStreams.WithLabelValues(k)
	}
	if reg != nil {
		reg.MustRegister(m.renewals, m.openStreams, m.keepAliveSize, m.batchSize)
	}
	return m
}

// refused counts a write rejected before it could be proposed (invalid; not leader and not forwardable).
func (m *Metrics) refused() { m.refusedProposals.Inc() }

func (m *Metrics) renewed(results []*leasepb.KeepAliveResult) {
	gone := 0
	for _, r := range results {
		if r.GetGone() {
			gone++
		}
	}
	// One label lookup per outcome, not per lease: a batch renews thousands.
	if gone > 0 {
		m.renewals.WithLabelValues("gone").Add(float64(gone))
	}
	if renewed := len(results) - gone; renewed > 0 {
		m.renewals.WithLabelValues("renewed").Add(float64(renewed))
	}
}

// stream counts one open server stream of kind until the returned func is called.
func (m *Metrics) stream(kind string) func() {
	g := m.openStreams.WithLabelValues(kind)
	g.Inc()
	return g.Dec
}
