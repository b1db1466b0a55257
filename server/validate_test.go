package server

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server/internal/errs"
	"github.com/leased/leased/server/internal/lessor"
	"github.com/leased/leased/server/internal/rpc"
)

// TestTTLFloor: with the default election timeout (1 s) the floor is 8 s; a 3 s lease — lost on a leader
// SIGKILL before the floor existed — is refused at the edge with a message that names the floor and why,
// and a configured minimum below the floor is a configuration error. TestConfig has its own small floor.
func TestTTLFloor(t *testing.T) {
	cfg := DefaultConfig()
	if got := cfg.TTLFloor(); got != 8*time.Second {
		t.Fatalf("default TTL floor %v, want 8s", got)
	}
	l := cfg.limits()
	err := rpc.Validate(l, &leasepb.AcquireRequest{Resource: "r", Holder: "h", TtlMs: 3000})
	const want = "ttl_ms: 3000 is below the minimum 8000 (the TTL must outlast a leader failover: 8 × the 1s election timeout)"
	if !errors.Is(err, ErrInvalid) || err.Error() != want {
		t.Fatalf("acquire with a 3 s TTL: %v\nwant %s", err, want)
	}
	if err := rpc.Validate(l, &leasepb.AcquireRequest{Resource: "r", Holder: "h", TtlMs: 8000}); err != nil {
		t.Fatalf("acquire at the floor: %v", err)
	}
	if err := rpc.Validate(l, &leasepb.AcquireRequest{Resource: "r", Holder: "h", TtlMs: 3_600_001}); err == nil || !strings.Contains(err.Error(), "above the maximum 3600000") {
		t.Fatalf("acquire above the maximum: %v", err)
	}

	valid := func(c Config) Config {
		c.Name, c.DataDir, c.ClientAddr, c.PeerAddr = "n1", "/d", "h:1", "127.0.0.1:2"
		return c
	}
	if err := valid(cfg).Validate(); err != nil {
		t.Fatalf("default config: %v", err)
	}
	below := valid(cfg)
	below.Limits.MinTTL = 3 * time.Second
	if err := below.Validate(); err == nil || !strings.Contains(err.Error(), "min TTL 3s is below the TTL floor 8s") {
		t.Fatalf("min TTL below the floor: %v", err)
	}
	above := valid(cfg)
	above.Limits.MinTTL = 10 * time.Second
	if err := above.Validate(); err != nil {
		t.Fatalf("min TTL above the floor: %v", err)
	}
	if err := rpc.Validate(above.limits(), &leasepb.AcquireRequest{Resource: "r", Holder: "h", TtlMs: 9000}); err == nil ||
		!strings.Contains(err.Error(), "below the minimum 10000 (the configured minimum; the floor, for a TTL to outlast a leader failover, is 8s)") {
		t.Fatalf("acquire below a configured minimum above the floor: %v", err)
	}
	slower := valid(cfg)
	slower.TickInterval = 200 * time.Millisecond // a 2 s election timeout: the floor follows it
	if got := slower.TTLFloor(); got != 16*time.Second {
		t.Fatalf("floor with a 2 s election timeout %v, want 16s", got)
	}

	for _, long := range []struct{ ttl, delay time.Duration }{{maxStoredDuration + time.Millisecond, 0}, {time.Hour, 25 * 24 * time.Hour}} {
		c := valid(cfg)
		c.Limits.MaxTTL, c.Limits.MaxLockDelay = long.ttl, long.delay
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "must not exceed 596h31m23.647s") {
			t.Fatalf("max TTL %v, max lock delay %v: %v; want refused", long.ttl, long.delay, err)
		}
	}
	longest := valid(cfg)
	longest.Limits.MaxTTL, longest.Limits.MaxLockDelay = maxStoredDuration, maxStoredDuration
	if err := longest.Validate(); err != nil {
		t.Fatalf("the longest durations a lease stores: %v", err)
	}

	test := valid(TestConfig())
	if err := test.Validate(); err != nil {
		t.Fatalf("TestConfig: %v", err)
	}
	if got := test.limits().MinTTL; got != 800*time.Millisecond {
		t.Fatalf("TestConfig's minimum TTL %v, want its 800ms floor", got)
	}
}

// TestTTLAndLockDelayDoNotOverflow: a TTL of 2^58 ms and a lock-delay of MaxInt64 ms wrapped around
// when converted to nanoseconds and passed validation; both are InvalidArgument now, as are the values
// just past the limits, and the lessor's conversion saturates instead of wrapping.
func TestTTLAndLockDelayDoNotOverflow(t *testing.T) {
	l := DefaultConfig().limits()
	for _, tc := range []struct {
		name         string
		ttl, delay   int64
		field, wants string
	}{
		{"ttl 2^58 ms", 1 << 58, 0, "ttl_ms", "above the maximum 3600000"},
		{"ttl MaxInt64 ms", math.MaxInt64, 0, "ttl_ms", "above the maximum"},
		{"ttl MinInt64 ms", math.MinInt64, 0, "ttl_ms", "below the minimum"},
		{"ttl 2^63/1e6+1 ms", math.MaxInt64/1_000_000 + 1, 0, "ttl_ms", "above the maximum"},
		{"ttl one past the maximum", 3_600_001, 0, "ttl_ms", "above the maximum"},
		{"lock-delay MaxInt64 ms", 10_000, math.MaxInt64, "lock_delay_ms", "above the maximum 60000"},
		{"lock-delay 2^58 ms", 10_000, 1 << 58, "lock_delay_ms", "above the maximum 60000"},
		{"lock-delay one past the maximum", 10_000, 60_001, "lock_delay_ms", "above the maximum 60000"},
		{"lock-delay MinInt64 ms", 10_000, math.MinInt64, "lock_delay_ms", "below the minimum 0"},
	} {
		err := rpc.Validate(l, &leasepb.AcquireRequest{Resource: "r", Holder: "h", TtlMs: tc.ttl, LockDelayMs: tc.delay})
		var fe *errs.Field
		if !errors.As(err, &fe) || fe.Field != tc.field || !strings.Contains(err.Error(), tc.wants) {
			t.Errorf("%s: %v, want InvalidArgument on %s (%s)", tc.name, err, tc.field, tc.wants)
		}
	}
	if err := rpc.Validate(l, &leasepb.AcquireRequest{Resource: "r", Holder: "h", TtlMs: 3_600_000, LockDelayMs: 60_000}); err != nil {
		t.Fatalf("the maxima themselves: %v", err)
	}
	if d := lessor.Millis(math.MaxInt64); d <= 0 || d < 100*365*24*time.Hour {
		t.Fatalf("ms(MaxInt64) = %v, want a saturated positive duration", d)
	}
	if d := lessor.Millis(1 << 58); d <= 0 {
		t.Fatalf("ms(2^58) = %v wrapped", d)
	}
}

// A number outside a bound travels with an ErrorInfo naming the bound, so that clients can phrase the
// limit in their own units (leasectl: "--ttl 100ms is below the cluster's minimum 8s").
func TestBoundDetails(t *testing.T) {
	l := DefaultConfig().limits()
	for _, c := range []struct {
		req                  *leasepb.AcquireRequest
		reason, field, limit string
	}{
		{&leasepb.AcquireRequest{Resource: "r", Holder: "h", TtlMs: 100}, rpc.ReasonBelowMinimum, "ttl_ms", "8000"},
		{&leasepb.AcquireRequest{Resource: "r", Holder: "h", TtlMs: 3_600_001}, rpc.ReasonAboveMaximum, "ttl_ms", "3600000"},
		{&leasepb.AcquireRequest{Resource: "r", Holder: "h", TtlMs: 10_000, LockDelayMs: 3_600_001}, rpc.ReasonAboveMaximum, "lock_delay_ms", "60000"},
	} {
		st := status.Convert(rpc.ToStatus(rpc.Validate(l, c.req), rpc.Hint{}))
		var info *errdetails.ErrorInfo
		var bad *errdetails.BadRequest
		for _, d := range st.Details() {
			switch d := d.(type) {
			case *errdetails.ErrorInfo:
				info = d
			case *errdetails.BadRequest:
				bad = d
			}
		}
		if st.Code() != codes.InvalidArgument || bad == nil || bad.GetFieldViolations()[0].GetField() != c.field {
			t.Fatalf("%v: want InvalidArgument with a BadRequest naming %s, got %v", c.req, c.field, st)
		}
		if info == nil || info.GetReason() != c.reason || info.GetDomain() != rpc.ErrorInfoDomain ||
			info.GetMetadata()["field"] != c.field || info.GetMetadata()["limit"] != c.limit {
			t.Fatalf("%v: ErrorInfo %v, want %s %s limit %s", c.req, info, c.reason, c.field, c.limit)
		}
	}
	st := status.Convert(rpc.ToStatus(rpc.Validate(l, &leasepb.AcquireRequest{Resource: "r", Holder: "h", TtlMs: 100}), rpc.Hint{}))
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && !strings.Contains(info.GetMetadata()["why"], "leader failover") {
			t.Errorf("the minimum TTL's ErrorInfo does not say why: %v", info)
		}
	}
}

// An attempt number belongs to a request id: without one it is refused at the edge; a stale attempt's
// refusal travels as ABORTED with an ErrorInfo naming the request id and the attempts.
func TestAttemptNeedsRequestIDAndStaleAttemptStatus(t *testing.T) {
	l := DefaultConfig().limits()
	err := rpc.Validate(l, &leasepb.AcquireRequest{Resource: "r", Holder: "h", TtlMs: 10_000, Attempt: 2})
	var fe *errs.Field
	if !errors.As(err, &fe) || fe.Field != "attempt" {
		t.Fatalf("attempt without request_id: %v, want InvalidArgument on attempt", err)
	}
	if err := rpc.Validate(l, &leasepb.AcquireRequest{Resource: "r", Holder: "h", TtlMs: 10_000, RequestId: "x", Attempt: 2}); err != nil {
		t.Fatalf("attempt with request_id: %v", err)
	}
}

// wait_ms ends a wait: it needs wait, is not negative, and is bounded (in milliseconds, never converted
// first, as the TTL).
func TestWaitMsIsChecked(t *testing.T) {
	l := DefaultConfig().limits()
	for _, tc := range []struct {
		wait   bool
		waitMs int64
		reason string // "" for accepted
	}{
		{true, 0, ""},
		{true, 1, ""},
		{true, rpc.MaxWait.Milliseconds(), ""},
		{false, 0, ""},
		{false, 500, "requires wait"},
		{true, -1, "below the minimum 0"},
		{true, math.MinInt64, "below the minimum 0"},
		{true, rpc.MaxWait.Milliseconds() + 1, "above the maximum 31622400000"},
		{true, math.MaxInt64, "above the maximum 31622400000"},
	} {
		err := rpc.Validate(l, &leasepb.AcquireRequest{Resource: "r", Holder: "h", TtlMs: 10_000, Wait: tc.wait, WaitMs: tc.waitMs})
		var fe *errs.Field
		switch {
		case tc.reason == "" && err != nil:
			t.Errorf("wait %v, wait_ms %d: %v, want accepted", tc.wait, tc.waitMs, err)
		case tc.reason != "" && (!errors.As(err, &fe) || fe.Field != "wait_ms" || !strings.Contains(fe.Reason, tc.reason)):
			t.Errorf("wait %v, wait_ms %d: %v, want InvalidArgument on wait_ms: %s", tc.wait, tc.waitMs, err, tc.reason)
		}
	}
}
