package rpc

import (
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/fsm"
)

// A stale attempt's refusal travels as ABORTED with an ErrorInfo naming the request id and the attempts.
func TestStaleAttemptStatus(t *testing.T) {
	st := status.Convert(ToStatus(&supersededError{stale: fsm.StaleAttempt{RequestID: "x", Attempt: 1, Answered: 2}}, Hint{}))
	if st.Code() != codes.Aborted || !strings.Contains(st.Message(), `a later attempt of request id "x" was already answered`) {
		t.Fatalf("status = %v", st)
	}
	var info *errdetails.ErrorInfo
	for _, d := range st.Details() {
		if i, ok := d.(*errdetails.ErrorInfo); ok {
			info = i
		}
	}
	if info == nil || info.GetReason() != "ATTEMPT_SUPERSEDED" || info.GetMetadata()["answered_attempt"] != "2" || info.GetMetadata()["attempt"] != "1" {
		t.Fatalf("details = %v", st.Details())
	}
	ended := status.Convert(ToStatus(&supersededError{stale: fsm.StaleAttempt{RequestID: "x", Attempt: 3, GrantEnded: true}}, Hint{}))
	if ended.Code() != codes.Aborted || !strings.Contains(ended.Message(), `request id "x"'s grant already ended`) {
		t.Fatalf("grant ended: %v", ended)
	}
}
