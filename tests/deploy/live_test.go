package deploy

import (
	"context"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest"
)

// TestContractIsWhatANodeExports gathers a live node's registry and checks that the contract's node
// series — the names the dashboard and the alerts are checked against — are exactly what the server
// exports under leased_ and grpc_server_: the literal list cannot drift from the code.
func TestContractIsWhatANodeExports(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster: skipped with -short")
	}
	var mu sync.Mutex // mutate may be called from the nodes' start-up
	regs := map[string]*prometheus.Registry{}
	c := servertest.Start(t, 3, func(cfg *server.Config) { // three: the per-peer series need peers
		reg := prometheus.NewRegistry()
		mu.Lock()
		regs[cfg.Name] = reg
		mu.Unlock()
		cfg.Registerer = reg
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c.WaitLeader()
	// One call, so that the gRPC metrics have a method to report.
	if _, err := c.Leases(0).Acquire(ctx, &leasepb.AcquireRequest{Resource: "deploy/probe", Holder: "h", TtlMs: 5000}); err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, reg := range regs {
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			exported[f.GetName()] = true
		}
	}
	var missing, extra []string
	for name := range nodeMetrics {
		if !exported[name] {
			missing = append(missing, name)
		}
	}
	for name := range exported {
		if _, ok := nodeMetrics[name]; !ok && (strings.HasPrefix(name, "leased_") || strings.HasPrefix(name, "grpc_server_")) {
			extra = append(extra, name)
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	if len(missing) > 0 {
		t.Errorf("in the contract but not exported by a node: %v", missing)
	}
	if len(extra) > 0 {
		t.Errorf("exported by a node but not in the contract (add them to nodeMetrics, and to the dashboard): %v", extra)
	}
}
