package chaos

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestFloodChecker: a server that refuses exactly the excess passes; one that serves everything past
// its limit, or refuses naming another flag, is a finding.
func TestFloodChecker(t *testing.T) {
	refusal := func(flag string) error {
		st, err := status.New(codes.ResourceExhausted, "too many").WithDetails(&errdetails.QuotaFailure{
			Violations: []*errdetails.QuotaFailure_Violation{{Subject: flag}}})
		if err != nil {
			t.Fatal(err)
		}
		return st.Err()
	}
	server := func(limit int, flag string) func(context.Context, int) error {
		return func(ctx context.Context, k int) error {
			if k >= limit {
				return refusal(flag)
			}
			<-ctx.Done()
			return status.FromContextError(ctx.Err()).Err()
		}
	}
	const flag = "--max-watchers-per-conn"
	total, hold := floodWatchersPerConn+floodExcess, 300*time.Millisecond
	for _, c := range []struct {
		name    string
		limit   int
		flag    string
		finding bool
	}{
		{"enforced", floodWatchersPerConn, flag, false},
		{"not enforced", total, flag, true},
		{"off by one", floodWatchersPerConn + 1, flag, true},
		{"another flag", floodWatchersPerConn, "--max-streams-per-conn", true},
	} {
		r := &run{}
		o := flood(context.Background(), total, hold, flag, server(c.limit, c.flag))
		r.checkFloodOutcome("watch", flag, floodWatchersPerConn, o)
		if got := len(r.floodFindings) > 0; got != c.finding {
			t.Errorf("%s: outcome %v, findings %v", c.name, o, r.floodFindings)
		}
		if c.finding && !strings.Contains(r.floodFindings[0], flag) {
			t.Errorf("%s: the finding does not name the flag: %v", c.name, r.floodFindings)
		}
	}
}
