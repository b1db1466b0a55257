package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// clientMetrics are the SDK's Prometheus metrics (the leased_client_* series of the metrics contract,
// docs/operations.md "Metrics"), registered on Config.Registerer. A nil *clientMetrics records nothing.
// The SDK depends on client_golang only for this: the stack uses Prometheus already (the server exports
// it), and a Registerer is the one way to put the SDK's series next to the application's own.
type clientMetrics struct {
	requests   *prometheus.CounterVec   // method, code
	duration   *prometheus.HistogramVec // method
	held       prometheus.Gauge
	lost       *prometheus.CounterVec // reason
	renewalRTT prometheus.Histogram
}

// Reasons a lease is lost (leased_client_leases_lost_total).
const (
	lostExpired     = "expired"
	lostLostContact = "lost_contact"
)

// leasesMethods are the RPCs whose series exist from the start (Writes: one request on the stream).
var leasesMethods = []string{"Acquire", "Renew", "Release", "Batch", "Writes", "Get", "List", "ValidateToken", "Status", "MemberList"}

func newClientMetrics(reg prometheus.Registerer) (*clientMetrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &clientMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leased_client_requests_total", Help: "Unary RPCs this client sent (each attempt), and requests on its Writes streams, by method and gRPC code.",
		}, []string{"method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "leased_client_request_duration_seconds", Help: "Time of one unary RPC attempt, or of one request on a Writes stream, by method.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"method"}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "leased_client_leases_held", Help: "Leases this client holds and keeps alive.",
		}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leased_client_leases_lost_total", Help: "Leases this client lost before releasing them, by reason.",
		}, []string{"reason"}),
		renewalRTT: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "leased_client_renewal_round_trip_seconds", Help: "Time from sending a KeepAlive message to its answer.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
	}
	for _, method := range leasesMethods {
		m.requests.WithLabelValues(method, "OK")
		m.duration.WithLabelValues(method)
	}
	m.lost.WithLabelValues(lostExpired)
	m.lost.WithLabelValues(lostLostContact)
	var errs []error
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.held, m.lost, m.renewalRTT} {
		errs = append(errs, reg.Register(c))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("%w: register metrics: %v", ErrInvalid, err)
	}
	return m, nil
}

// dialOptions add the per-RPC instrumentation to a connection.
func (m *clientMetrics) dialOptions() []grpc.DialOption {
	if m == nil {
		return nil
	}
	return []grpc.DialOption{grpc.WithChainUnaryInterceptor(m.intercept)}
}

func (m *clientMetrics) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	start := time.Now()
	err := invoker(ctx, method, req, reply, cc, opts...)
	name := method[strings.LastIndexByte(method, '/')+1:]
	m.requests.WithLabelValues(name, status.Code(err).String()).Inc()
	m.duration.WithLabelValues(name).Observe(time.Since(start).Seconds())
	return err
}

func (m *clientMetrics) leaseHeld() {
	if m != nil {
		m.held.Inc()
	}
}

// leaseEnded records the end of a held lease: lost, for the reasons that mean it.
func (m *clientMetrics) leaseEnded(why error) {
	if m == nil {
		return
	}
	m.held.Dec()
	switch {
	case errors.Is(why, ErrExpired):
		m.lost.WithLabelValues(lostExpired).Inc()
	case errors.Is(why, ErrLostContact):
		m.lost.WithLabelValues(lostLostContact).Inc()
	}
}

func (m *clientMetrics) renewalAnswered(rtt time.Duration) {
	if m != nil {
		m.renewalRTT.Observe(rtt.Seconds())
	}
}

// writesRequest records one request on a Writes stream, sent at sent, as the unary interceptor records a
// call.
func (m *clientMetrics) writesRequest(code codes.Code, sent time.Time) {
	if m != nil {
		m.requests.WithLabelValues("Writes", code.String()).Inc()
		m.duration.WithLabelValues("Writes").Observe(time.Since(sent).Seconds())
	}
}
