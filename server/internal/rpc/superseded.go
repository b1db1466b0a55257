package rpc

import (
	"fmt"
	"strconv"

	"google.golang.org/genproto/googleapis/rpc/errdetails"

	"github.com/leased/leased/fsm"
)

// ErrorInfo reasons of a stale Acquire attempt (fsm/attempts.go), answered ABORTED: the attempt changed
// nothing. Its caller has normally given up on it long ago (it was delayed on the way); a client that
// still waits for it learns that another attempt of its request id was answered first.
const (
	reasonAttemptSuperseded = "ATTEMPT_SUPERSEDED"
	reasonGrantEnded        = "GRANT_ENDED"
)

// supersededError is an Acquire the state machine found stale.
type supersededError struct{ stale fsm.StaleAttempt }

func (e *supersededError) Error() string {
	if e.stale.GrantEnded {
		return fmt.Sprintf("request id %q's grant already ended (released or expired): attempt %d changed nothing; use a new request id for a new acquire",
			e.stale.RequestID, e.stale.Attempt)
	}
	return fmt.Sprintf("a later attempt of request id %q was already answered (attempt %d was refused): attempt %d changed nothing",
		e.stale.RequestID, e.stale.Answered, e.stale.Attempt)
}

func (e *supersededError) detail() *errdetails.ErrorInfo {
	reason := reasonAttemptSuperseded
	if e.stale.GrantEnded {
		reason = reasonGrantEnded
	}
	return &errdetails.ErrorInfo{Reason: reason, Domain: ErrorInfoDomain, Metadata: map[string]string{
		"request_id":       e.stale.RequestID,
		"attempt":          strconv.FormatUint(uint64(e.stale.Attempt), 10),
		"answered_attempt": strconv.FormatUint(uint64(e.stale.Answered), 10),
	}}
}
