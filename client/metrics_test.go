package client_test

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/client"
	"github.com/leased/leased/server/servertest"
)

// TestClientMetrics: with Config.Registerer the SDK counts its requests, the leases it holds, a lease it
// lost (released behind its back: the next renewal answers gone) and its renewal round trips.
func TestClientMetrics(t *testing.T) {
	cluster := servertest.Start(t, 1, nil)
	reg := prometheus.NewRegistry()
	c := newClient(t, cluster.Endpoints(), func(cfg *client.Config) { cfg.Registerer = reg })
	ctx := ctxT(t)
	ttl := cluster.Config(0).TTLFloor()
	kept, err := c.Acquire(ctx, "cm/kept", client.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	lost, err := c.Acquire(ctx, "cm/lost", client.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	if got := gauge(t, reg, "leased_client_leases_held"); got != 2 {
		t.Errorf("leases held = %v, want 2", got)
	}
	// Released behind the client's back: its next renewal is answered gone.
	if _, err := cluster.Leases(0).Release(ctx, &leasepb.ReleaseRequest{Resource: "cm/lost", Token: lost.Token()}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lost.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the lease released behind the client's back was never lost")
	}
	if !errors.Is(lost.Err(), client.ErrExpired) {
		t.Fatalf("lost lease err = %v, want ErrExpired", lost.Err())
	}
	if err := kept.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := gauge(t, reg, "leased_client_leases_held"); got != 0 {
		t.Errorf("leases held after both ended = %v, want 0", got)
	}
	counts := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, lp := range m.GetLabel() {
				key += "," + lp.GetName() + "=" + lp.GetValue()
			}
			switch {
			case m.GetCounter() != nil:
				counts[key] = m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				counts[key] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	for key, atLeast := range map[string]float64{
		// The quick writes (two acquires, a release) travel on the Writes stream, a request each.
		"leased_client_requests_total,code=OK,method=Writes":   3,
		"leased_client_request_duration_seconds,method=Writes": 3,
		"leased_client_leases_lost_total,reason=expired":       1,
		"leased_client_renewal_round_trip_seconds":             1,
	} {
		if got, ok := counts[key]; !ok || got < atLeast {
			t.Errorf("%s = %v (present %v), want >= %v", key, got, ok, atLeast)
		}
	}
	if got, ok := counts["leased_client_leases_lost_total,reason=lost_contact"]; !ok || got != 0 {
		t.Errorf("lost_contact = %v (present %v), want 0, pre-initialised", got, ok)
	}
	// One Registerer, one client.
	if _, err := client.New(client.Config{Endpoints: cluster.Endpoints(), Registerer: reg}); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("a second client on the same Registerer: %v, want ErrInvalid", err)
	}
}

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	n, err := testutil.GatherAndCount(reg, name)
	if err != nil || n != 1 {
		t.Fatalf("%s: %d series, %v", name, n, err)
	}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}
