package lessor

import "github.com/prometheus/client_golang/prometheus"

// RegisterMetrics registers the lessor's series of the metrics contract (docs/operations.md, "Metrics")
// on reg (nowhere when it is nil): leased_expiry_lag_seconds, which the leader observes as it expires
// leases. Call it before the lessor is used; the lag is observed with the lessor's lock held.
func (l *Lessor) RegisterMetrics(reg prometheus.Registerer) {
	lag := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "leased_expiry_lag_seconds",
		Help:    "On the leader: how late after its deadline a lease was expired (apply of the Expire minus the deadline).",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
	})
	if reg != nil {
		reg.MustRegister(lag)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.expiryLag = lag.Observe
}
