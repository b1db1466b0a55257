package server_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

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
# HELP leased_fsm_events_total Lease events applied to this node's state machine, by type.
# TYPE leased_fsm_events_total counter
leased_fsm_events_total{type="granted"} 1
# HELP leased_fsm_live_leases Live leases in this node's state machine.
# TYPE leased_fsm_live_leases gauge
leased_fsm_live_leases 1
# HELP leased_lessor_renewals_total Lease renewals answered by this node as leader, by outcome.
# TYPE leased_lessor_renewals_total counter
leased_lessor_renewals_total{outcome="renewed"} 1
# HELP leased_raft_is_leader 1 while this node leads.
# TYPE leased_raft_is_leader gauge
leased_raft_is_leader 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"leased_fsm_events_total", "leased_fsm_live_leases", "leased_lessor_renewals_total", "leased_raft_is_leader"); err != nil {
		t.Fatal(err)
	}
}
