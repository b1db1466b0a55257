package watch

import "github.com/prometheus/client_golang/prometheus"

// RegisterMetrics registers the hub's series of the metrics contract (docs/operations.md, "Metrics") on
// reg: leased_watchers, read as it is scraped.
func (h *Hub) RegisterMetrics(reg prometheus.Registerer) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "leased_watchers", Help: "Watch streams subscribed on this node.",
	}, func() float64 { return float64(h.Len()) }))
}
