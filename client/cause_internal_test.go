package client

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// fromStatus never says a phrase twice: gRPC's own DeadlineExceeded reads "context deadline exceeded",
// which wrapped in context.DeadlineExceeded used to read "context deadline exceeded: context deadline
// exceeded".
func TestFromStatusSaysNothingTwice(t *testing.T) {
	for _, c := range []struct {
		code codes.Code
		msg  string
		want string
	}{
		{codes.DeadlineExceeded, "context deadline exceeded", "context deadline exceeded"},
		{codes.Canceled, "context canceled", "context canceled"},
		{codes.Unavailable, "leased: cluster unavailable", "leased: cluster unavailable"},
		{codes.Unavailable, "cluster unavailable", "leased: cluster unavailable"},
		{codes.Unavailable, "no leader", "leased: cluster unavailable: no leader"},
		{codes.NotFound, "", "leased: not found"},
		{codes.InvalidArgument, "ttl_ms: 100 is below the minimum 800", "leased: invalid argument: ttl_ms: 100 is below the minimum 800"},
	} {
		if got := fromStatus(status.Error(c.code, c.msg)).Error(); got != c.want {
			t.Errorf("fromStatus(%v %q) = %q, want %q", c.code, c.msg, got, c.want)
		}
	}
}

// An attempt that timed out is described once, without gRPC's "context deadline exceeded".
func TestAttemptTimeoutDescribedOnce(t *testing.T) {
	err := fmt.Errorf("%w after %v: %w", errAttemptTimeout, "1.666s", status.Error(codes.DeadlineExceeded, context.DeadlineExceeded.Error()))
	got := describeFailure("127.0.0.1:7102", err)
	if got != "127.0.0.1:7102: no answer after 1.666s" || strings.Contains(got, "deadline") {
		t.Fatalf("describeFailure = %q", got)
	}
}
