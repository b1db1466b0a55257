package server_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest"
)

func TestMetricsCountWhatTheNodeDoes(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := servertest.Start(t, 1, func(cfg *server.Config) { cfg.Registerer = reg })
	ctx := ctxT(t)
	resp, err := c.Leases(0).Acquire(ctx, &leasepb.AcquireRequest{Resource: "m", Holder: "h", TtlMs: 60_000})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Leases(0).Renew(ctx, &leasepb.RenewRequest{Resource: "m", Token: resp.GetLease().GetToken()}); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP leased_events_total Lease events applied to this node's state machine, by type.
# TYPE leased_events_total counter
leased_events_total{type="expired"} 0
leased_events_total{type="granted"} 1
leased_events_total{type="released"} 0
leased_events_total{type="value_changed"} 0
# HELP leased_live_leases Live leases in this node's state machine.
# TYPE leased_live_leases gauge
leased_live_leases 1
# HELP leased_renewals_total Lease renewals answered by this node as leader, by outcome.
# TYPE leased_renewals_total counter
leased_renewals_total{outcome="gone"} 0
leased_renewals_total{outcome="renewed"} 1
# HELP leased_is_leader 1 while this node leads.
# TYPE leased_is_leader gauge
leased_is_leader 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"leased_events_total", "leased_live_leases", "leased_renewals_total", "leased_is_leader"); err != nil {
		t.Fatal(err)
	}
}

// contractSeries are the node series of the metrics contract (docs/operations.md, "Metrics").
var contractSeries = []string{
	"leased_build_info", "leased_has_leader", "leased_loop_stalled_seconds", "leased_ready", "leased_disk_free_bytes", "leased_is_leader", "leased_leader_changes_total", "leased_term",
	"leased_proposals_total", "leased_disk_fsync_duration_seconds", "leased_apply_duration_seconds",
	"leased_raft_log_entries", "leased_db_size_bytes", "leased_snapshot_size_bytes", "leased_snapshot_duration_seconds",
	"leased_live_leases", "leased_waiters", "leased_watchers", "leased_open_streams", "leased_keepalive_batch_size",
	"leased_expiry_lag_seconds", "leased_peer_round_trip_seconds", "leased_peer_send_failures_total", "leased_peer_messages_dropped_total",
	"leased_renewals_total", "leased_read_index_duration_seconds", "leased_events_total", "leased_commit_index",
	"leased_applied_index", "leased_quota_bytes", "leased_quota_used_bytes", "leased_quota_exceeded", "leased_connections", "leased_connections_refused_total", "grpc_server_handled_total", "grpc_server_handling_seconds", "grpc_server_started_total",
	"grpc_server_msg_received_total", "grpc_server_msg_sent_total",
}

// scrape is one gathering of a registry: metric families by name.
type scrape map[string]*dto.MetricFamily

func gather(t *testing.T, reg *prometheus.Registry) scrape {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	s := scrape{}
	for _, mf := range mfs {
		s[mf.GetName()] = mf
	}
	return s
}

// find returns the series of name whose labels include every pair of labels (name, value, ...).
func (s scrape) find(name string, labels ...string) *dto.Metric {
	mf := s[name]
	if mf == nil {
		return nil
	}
next:
	for _, m := range mf.GetMetric() {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		return m
	}
	return nil
}

// value is a counter's, gauge's value, or a histogram's count; -1 when the series does not exist.
func (s scrape) value(name string, labels ...string) float64 {
	m := s.find(name, labels...)
	switch {
	case m == nil:
		return -1
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetHistogram() != nil:
		return float64(m.GetHistogram().GetSampleCount())
	}
	return -1
}

// TestMetricsContract runs a known workload on a real three-node cluster — grants, a release, an expiry,
// a KeepAlive, the leader stopping and another taking over — and finds every series of the metrics
// contract on every node, with values that say what happened.
func TestMetricsContract(t *testing.T) {
	c, reg := startWithRegistries(t, 3, func(cfg *server.Config) {
		cfg.SnapshotEntries = 5 // a snapshot within the workload
		cfg.SnapshotCatchUp = 2
	})
	ids := make([]string, c.Size())
	for i := range ids {
		ids[i] = leasepb.FormatID(c.Node(i).ID())
	}
	ctx := ctxT(t)
	li := c.WaitLeader()
	leader := c.Leases(li)

	// Two grants, a release, a KeepAlive renewal, then an expiry.
	held, err := leader.Acquire(ctx, &leasepb.AcquireRequest{Resource: "m/held", Holder: "h", TtlMs: 60_000})
	if err != nil {
		t.Fatal(err)
	}
	rel, err := leader.Acquire(ctx, &leasepb.AcquireRequest{Resource: "m/released", Holder: "h", TtlMs: 60_000})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leader.Release(ctx, &leasepb.ReleaseRequest{Resource: "m/released", Token: rel.GetLease().GetToken()}); err != nil {
		t.Fatal(err)
	}
	ka, err := leader.KeepAlive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ka.Send(&leasepb.KeepAliveRequest{Seq: 1, Leases: []*leasepb.LeaseRef{{Resource: "m/held", Token: held.GetLease().GetToken()}}}); err != nil {
		t.Fatal(err)
	}
	if resp, err := ka.Recv(); err != nil || resp.GetResults()[0].GetGone() {
		t.Fatalf("keepalive: %v %v", resp, err)
	}
	if s := gather(t, reg(li)); s.value("leased_open_streams", "kind", "keepalive") != 1 {
		t.Errorf("open keepalive streams on the leader = %v, want 1", s.value("leased_open_streams", "kind", "keepalive"))
	}
	_ = ka.CloseSend()
	ttl := c.Config(li).TTLFloor()
	if _, err := leader.Acquire(ctx, &leasepb.AcquireRequest{Resource: "m/expires", Holder: "h", TtlMs: ttl.Milliseconds()}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the expiry", func() bool {
		return gather(t, reg(li)).value("leased_events_total", "type", "expired") >= 1
	})
	first := gather(t, reg(li))
	if v := first.value("leased_proposals_total", "outcome", "applied"); v < 3 {
		t.Errorf("applied proposals on the leader = %v, want >= 3", v)
	}
	if v := first.value("grpc_server_handled_total", "grpc_method", "Acquire", "grpc_code", "OK"); v < 3 {
		t.Errorf("Acquire handled OK on the leader = %v, want >= 3", v)
	}
	if lag := first.find("leased_expiry_lag_seconds"); lag.GetHistogram().GetSampleCount() < 1 || lag.GetHistogram().GetSampleSum() <= 0 {
		t.Errorf("expiry lag on the leader = %v, want one expiry recorded late by > 0", lag)
	}
	for _, name := range []string{"leased_keepalive_batch_size", "leased_read_index_duration_seconds", "leased_peer_round_trip_seconds"} {
		if v := first.value(name); v < 1 {
			t.Errorf("%s count on the leader = %v, want >= 1", name, v)
		}
	}
	if v := first.value("leased_renewals_total", "outcome", "renewed"); v < 1 {
		t.Errorf("renewals on the leader = %v, want >= 1", v)
	}

	// The leader stops; another takes over.
	before := map[int]float64{}
	for i := range c.Size() {
		before[i] = gather(t, reg(i)).value("leased_leader_changes_total")
	}
	c.Stop(li)
	nli := c.WaitLeader()
	eventually(t, 10*time.Second, "the survivors to see the new leader", func() bool {
		for i := range c.Size() {
			if s := gather(t, reg(i)); i != li && (s.value("leased_has_leader") != 1 || s.value("leased_leader_changes_total") <= before[i]) {
				return false
			}
		}
		return true
	})
	eventually(t, 10*time.Second, "send failures to the stopped node", func() bool {
		return gather(t, reg(nli)).value("leased_peer_send_failures_total", "peer", ids[li]) > 0
	})

	for i := range c.Size() {
		name := c.Config(i).Name
		s := gather(t, reg(i))
		for _, series := range contractSeries {
			if s[series] == nil {
				t.Errorf("%s: %s missing", name, series)
			}
		}
		bi := s.find("leased_build_info")
		goversion := ""
		for _, lp := range bi.GetLabel() {
			if lp.GetName() == "goversion" {
				goversion = lp.GetValue()
			}
		}
		if bi.GetGauge().GetValue() != 1 || !strings.HasPrefix(goversion, "go") {
			t.Errorf("%s: leased_build_info = %v, want 1 with goversion set", name, bi)
		}
		for _, o := range []string{"applied", "failed", "timed_out", "refused"} {
			if s.value("leased_proposals_total", "outcome", o) < 0 {
				t.Errorf("%s: proposals outcome %q not pre-initialised", name, o)
			}
		}
		for j := range c.Size() {
			if j == i {
				continue
			}
			peer := ids[j]
			if s.value("leased_peer_round_trip_seconds", "peer", peer) < 0 || s.value("leased_peer_send_failures_total", "peer", peer) < 0 {
				t.Errorf("%s: no series for peer %s", name, peer)
			}
		}
		for _, g := range []string{"leased_term", "leased_commit_index", "leased_applied_index", "leased_db_size_bytes", "leased_disk_free_bytes", "leased_raft_log_entries", "leased_snapshot_size_bytes"} {
			if v := s.value(g); v <= 0 && i != li {
				t.Errorf("%s: %s = %v, want > 0", name, g, v)
			}
		}
		for _, h := range []string{"leased_disk_fsync_duration_seconds", "leased_apply_duration_seconds", "leased_snapshot_duration_seconds"} {
			if v := s.value(h); v < 1 {
				t.Errorf("%s: %s count = %v, want >= 1", name, h, v)
			}
		}
		if i == li {
			continue // stopped
		}
		if s.value("leased_has_leader") != 1 || s.value("leased_ready") != 1 {
			t.Errorf("%s: has_leader = %v, ready = %v after the new election", name, s.value("leased_has_leader"), s.value("leased_ready"))
		}
		if want := boolValue(i == nli); s.value("leased_is_leader") != want {
			t.Errorf("%s: is_leader = %v, want %v", name, s.value("leased_is_leader"), want)
		}
		if v := s.value("leased_leader_changes_total"); v <= before[i] || before[i] < 1 {
			t.Errorf("%s: leader changes %v before the leader stopped, %v after: want more", name, before[i], v)
		}
		for typ, want := range map[string]float64{"granted": 3, "released": 1, "expired": 1} {
			if v := s.value("leased_events_total", "type", typ); v < want {
				t.Errorf("%s: %s events = %v, want >= %v", name, typ, v, want)
			}
		}
		if v := s.value("leased_live_leases"); v != 1 {
			t.Errorf("%s: live leases = %v, want 1", name, v)
		}
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
