package waitq

import "github.com/prometheus/client_golang/prometheus"

// RegisterMetrics registers the queue's series of the metrics contract (docs/operations.md, "Metrics")
// on reg: leased_waiters, read as it is scraped.
func (q *Queue) RegisterMetrics(reg prometheus.Registerer) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "leased_waiters", Help: "Blocking acquires waiting on this node (leader).",
	}, func() float64 { return float64(q.Len()) }))
}
