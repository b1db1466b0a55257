package server

import (
	"math"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server/internal/lessor"
	"github.com/leased/leased/server/internal/rpc"
)

// FuzzValidateRequests decodes arbitrary bytes as each client request and validates it: no panic, and
// anything accepted really is within the documented limits.
func FuzzValidateRequests(f *testing.F) {
	for _, m := range []proto.Message{
		&leasepb.AcquireRequest{Resource: "db/primary", Holder: "host-1:42", TtlMs: 5000, RequestId: "r1", Value: []byte("v")},
		// Values that wrapped around when converted to nanoseconds.
		&leasepb.AcquireRequest{Resource: "r", Holder: "h", TtlMs: 1 << 58},
		&leasepb.AcquireRequest{Resource: "r", Holder: "h", TtlMs: 5000, LockDelayMs: math.MaxInt64},
		&leasepb.AcquireRequest{Resource: "r", Holder: "h", TtlMs: math.MinInt64},
		&leasepb.ListRequest{Prefix: "jobs/", Limit: 10, PageToken: "jobs/a"},
		&leasepb.WatchRequest{Prefix: "a/", FromIndex: 9},
		&leasepb.KeepAliveRequest{Seq: 1, Leases: []*leasepb.LeaseRef{{Resource: "r", Token: 3}}},
	} {
		b, _ := proto.Marshal(m)
		f.Add(b)
	}
	l := DefaultConfig().limits()
	f.Fuzz(func(t *testing.T, data []byte) {
		var acq leasepb.AcquireRequest
		if proto.Unmarshal(data, &acq) == nil && rpc.Validate(l, &acq) == nil {
			checkResource(t, l, acq.GetResource())
			// In milliseconds and in float64: a Duration conversion would overflow (the bug this guards).
			ttl, delay := float64(acq.GetTtlMs()), float64(acq.GetLockDelayMs())
			if acq.GetHolder() == "" || len(acq.GetHolder()) > l.MaxHolderBytes ||
				ttl*1e6 < float64(l.MinTTL) || ttl*1e6 > float64(l.MaxTTL) ||
				len(acq.GetValue()) > l.MaxValueBytes || delay < 0 || delay*1e6 > float64(l.MaxLockDelay) {
				t.Fatalf("accepted an acquire outside the limits: %v", &acq)
			}
			if d := lessor.Millis(acq.GetTtlMs()); d < l.MinTTL || d > l.MaxTTL {
				t.Fatalf("the lessor turns an accepted TTL of %d ms into %v", acq.GetTtlMs(), d)
			}
		}
		var list leasepb.ListRequest
		if proto.Unmarshal(data, &list) == nil && rpc.Validate(l, &list) == nil && list.GetLimit() > uint32(l.MaxListLimit) {
			t.Fatalf("accepted a list page of %d", list.GetLimit())
		}
		var w leasepb.WatchRequest
		if proto.Unmarshal(data, &w) == nil && rpc.Validate(l, &w) == nil && w.GetResource() != "" {
			checkResource(t, l, w.GetResource())
		}
		var ka leasepb.KeepAliveRequest
		if proto.Unmarshal(data, &ka) == nil && rpc.Validate(l, &ka) == nil {
			for _, ref := range ka.GetLeases() {
				checkResource(t, l, ref.GetResource())
				if ref.GetToken() == 0 {
					t.Fatal("accepted token 0")
				}
			}
		}
	})
}

func checkResource(t *testing.T, l Limits, r string) {
	t.Helper()
	if r == "" || len(r) > l.MaxResourceBytes || strings.HasPrefix(r, "/") || strings.HasSuffix(r, "/") || strings.Contains(r, "//") {
		t.Fatalf("accepted resource %q", r)
	}
	for i := 0; i < len(r); i++ {
		if !allowedInResource(r[i]) {
			t.Fatalf("accepted resource %q with byte %q", r, r[i])
		}
	}
}

// allowedInResource is the documented set, [A-Za-z0-9] and "/_-.:@=+", written out independently of
// resourceByte's table.
func allowedInResource(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("/_-.:@=+", c) >= 0
}
