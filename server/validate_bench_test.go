package server

import (
	"fmt"
	"testing"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server/internal/rpc"
)

// BenchmarkValidateKeepAlive: the edge's check of a KeepAlive of 1,000 leases, which the leader runs for
// every batch of renewals (docs/benchmarks.md).
func BenchmarkValidateKeepAlive(b *testing.B) {
	l := TestConfig().Limits
	req := &leasepb.KeepAliveRequest{}
	for i := range 1000 {
		req.Leases = append(req.Leases, &leasepb.LeaseRef{Resource: fmt.Sprintf("bench/keepalive/%d", i), Token: uint64(i + 1)})
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := rpc.Validate(l, req); err != nil {
			b.Fatal(err)
		}
	}
}
