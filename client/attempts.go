package client

import (
	"context"
	"errors"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/leasepb"
)

// Attempt numbers. Every attempt of one Acquire (one request id) carries its number, 1, 2, 3..., counted
// across the attempts without waiting and the waiting ones of WithWait (the waiting attempts are the
// later ones). The cluster refuses an attempt that arrives after a later one was answered with a
// refusal, or after the request id's grant ended (docs/client.md, "Retry safety"): such an attempt was
// delayed on its way (a stalled link, a node that saw it late) and its caller has moved on, so it must
// not take effect after the answer the caller got.

// ErrSuperseded: an Acquire attempt arrived after its request id was already answered, and changed
// nothing. See *SupersededError. Acquire sees it only when another call used the same request id
// (WithRequestID): a refusal answered to that call is retried here under a later attempt number, so
// ErrSuperseded reaches the caller only when the request id's grant already ended.
var ErrSuperseded = errors.New("leased: acquire attempt superseded")

// SupersededError describes a stale Acquire attempt the cluster refused.
type SupersededError struct {
	RequestID string
	// Attempt is the refused attempt's number; Answered the highest attempt of the request id the
	// cluster answered with a refusal (0 if none).
	Attempt, Answered uint32
	// GrantEnded: a grant made under the request id was released or expired; the request id's intent is
	// finished, and a new acquire needs a new request id.
	GrantEnded bool
	msg        string
}

func (e *SupersededError) Error() string { return "leased: " + e.msg }

// Is makes errors.Is(err, ErrSuperseded) true.
func (e *SupersededError) Is(target error) bool { return target == ErrSuperseded }

// supersededErrorOf reads the ErrorInfo of an Aborted answer.
func supersededErrorOf(st *status.Status) (*SupersededError, bool) {
	for _, d := range st.Details() {
		info, ok := d.(*errdetails.ErrorInfo)
		if !ok || info.GetDomain() != "leased" || (info.GetReason() != "ATTEMPT_SUPERSEDED" && info.GetReason() != "GRANT_ENDED") {
			continue
		}
		md := info.GetMetadata()
		attempt, _ := strconv.ParseUint(md["attempt"], 10, 32)
		answered, _ := strconv.ParseUint(md["answered_attempt"], 10, 32)
		return &SupersededError{RequestID: md["request_id"], Attempt: uint32(attempt), Answered: uint32(answered),
			GrantEnded: info.GetReason() == "GRANT_ENDED", msg: st.Message()}, true
	}
	return nil, false
}

// intent numbers the attempts of one Acquire call. Attempts are sequential (callWith makes one at a
// time), so a plain counter suffices.
type intent struct {
	last uint32
	// waitEnds is the caller's deadline for a waiting Acquire (zero: none); each waiting attempt asks
	// the cluster to end its wait shortly before it (waitMsBefore).
	waitEnds time.Time
}

// next is the number of the next attempt.
func (in *intent) next() uint32 {
	in.last++
	return in.last
}

// sendAttempt sends req as the intent's next attempt. If the cluster says a later attempt of the
// request id than this one was already answered with a refusal, another Acquire call with the same
// request id made it (this call's own earlier attempts are all numbered lower, and none of them is
// listened to any more): the intent is asked again, once, under a number above the answered one, so a
// reused request id is not refused forever.
func (in *intent) sendAttempt(ctx context.Context, w *batcher, req *leasepb.AcquireRequest, opts ...grpc.CallOption) (*leasepb.AcquireResponse, error) {
	resp, err := in.send(ctx, w, req, in.next(), opts...)
	st, _ := status.FromError(err)
	if se, ok := supersededErrorOf(st); err != nil && ok && !se.GrantEnded && se.Answered >= in.last {
		in.last = se.Answered
		resp, err = in.send(ctx, w, req, in.next(), opts...)
	}
	return resp, err
}

func (in *intent) send(ctx context.Context, w *batcher, req *leasepb.AcquireRequest, attempt uint32, opts ...grpc.CallOption) (*leasepb.AcquireResponse, error) {
	numbered := proto.CloneOf(req)
	numbered.Attempt = attempt
	if numbered.GetWait() && !in.waitEnds.IsZero() {
		numbered.WaitMs = waitMsBefore(in.waitEnds, time.Now())
	}
	return w.acquire(ctx, numbered, opts...)
}

// waitMsBefore is the wait_ms of a waiting attempt sent at now for a caller whose deadline is deadline:
// the wait ends a tenth of the time left before the deadline (at least 100 ms, at most a second), room
// for the cluster's answer — a read or an entry, and the way back — to arrive before the caller stops
// listening. At least 1 ms: 0 would mean no end at all.
func waitMsBefore(deadline, now time.Time) int64 {
	left := deadline.Sub(now)
	room := min(max(left/10, 100*time.Millisecond), time.Second)
	return max((left - room).Milliseconds(), 1)
}
