package client_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/client"
	"github.com/leased/leased/server/servertest/loopback"
)

// fakeLeases is a Leases service that answers Release and Renew from a script, one answer per call;
// the last answer repeats.
type fakeLeases struct {
	leasepb.UnimplementedLeasesServer
	mu      sync.Mutex
	answers []func() (any, error)
	calls   int
	// acquired are the request ids of the Acquire requests served, in order.
	acquired []string
}

func (f *fakeLeases) next() (any, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a := f.answers[min(f.calls, len(f.answers)-1)]
	f.calls++
	return a()
}

func (f *fakeLeases) Release(context.Context, *leasepb.ReleaseRequest) (*leasepb.ReleaseResponse, error) {
	resp, err := f.next()
	if err != nil {
		return nil, err
	}
	return answerAs[*leasepb.ReleaseResponse](resp)
}

func (f *fakeLeases) Acquire(_ context.Context, req *leasepb.AcquireRequest) (*leasepb.AcquireResponse, error) {
	f.mu.Lock()
	f.acquired = append(f.acquired, req.GetRequestId())
	f.mu.Unlock()
	resp, err := f.next()
	if err != nil {
		return nil, err
	}
	return answerAs[*leasepb.AcquireResponse](resp)
}

func (f *fakeLeases) Renew(context.Context, *leasepb.RenewRequest) (*leasepb.RenewResponse, error) {
	resp, err := f.next()
	if err != nil {
		return nil, err
	}
	return answerAs[*leasepb.RenewResponse](resp)
}

// answerAs gives a scripted answer as the response type a method returns; a script meant for another
// method (the SDK's background renewals of a lease a test holds) gets an Unavailable.
func answerAs[T any](resp any) (T, error) {
	out, ok := resp.(T)
	if !ok {
		return out, status.Errorf(codes.Unavailable, "no scripted answer of type %T", out)
	}
	return out, nil
}

func statusWith(code codes.Code, msg string, details ...protoadapt.MessageV1) error {
	st, err := status.New(code, msg).WithDetails(details...)
	if err != nil {
		panic(err)
	}
	return st.Err()
}

// The server's answers, as leased gives them.
var (
	lostLeadership = func() (any, error) {
		return nil, statusWith(codes.Unavailable, "leadership lost before the entry applied, outcome unknown: not the leader",
			&leasepb.LeaderHint{OutcomeUnknown: true})
	}
	notLeaderNoHint = func() (any, error) {
		return nil, statusWith(codes.Unavailable, "no leader", &leasepb.LeaderHint{})
	}
	serverTimedOut = func() (any, error) {
		return nil, status.Error(codes.DeadlineExceeded, "proposal not applied in time: timed out")
	}
	alreadyReleased = func() (any, error) { return &leasepb.ReleaseResponse{AlreadyReleased: true, ReleasedIndex: 9}, nil }
	notFoundBare    = func() (any, error) { return nil, status.Error(codes.NotFound, "token is not the current grant") }
	notFoundExpired = func() (any, error) {
		return nil, statusWith(codes.NotFound, "token is not the current grant: expired",
			&leasepb.LeaseEnded{Resource: "r", Token: 5, How: leasepb.EventType_EVENT_TYPE_EXPIRED, Index: 8})
	}
	notFoundNever = func() (any, error) {
		return nil, statusWith(codes.NotFound, "token is not the current grant", &leasepb.LeaseEnded{Resource: "r", Token: 5})
	}
	notFoundForgotten = func() (any, error) {
		return nil, statusWith(codes.NotFound, "token is not the current grant: forgotten",
			&leasepb.LeaseEnded{Resource: "r", Token: 5, Forgotten: true})
	}
	renewed = func() (any, error) { return &leasepb.RenewResponse{TtlMs: 5000}, nil }
)

// TestReleaseAfterAnUnknownOutcomeSaysWhatHappened is issue #11: a release answered "outcome unknown",
// then retried, must not come back as a definite ErrNotFound unless the server says the release did not
// take effect.
func TestReleaseAfterAnUnknownOutcomeSaysWhatHappened(t *testing.T) {
	tests := []struct {
		name          string
		answers       []func() (any, error)
		wantOK        bool
		wantUnknown   bool // errors.Is ErrOutcomeUnknown, and not ErrNotFound
		wantNotFound  bool
		wantExpired   bool
		deadlineShort bool
	}{
		{name: "the retry finds it already released", answers: []func() (any, error){lostLeadership, alreadyReleased}, wantOK: true},
		{name: "after a server timeout, already released", answers: []func() (any, error){serverTimedOut, alreadyReleased}, wantOK: true},
		{name: "the retry finds it expired", answers: []func() (any, error){lostLeadership, notFoundExpired}, wantNotFound: true, wantExpired: true},
		{name: "the retry finds it never was a grant", answers: []func() (any, error){lostLeadership, notFoundNever}, wantNotFound: true},
		{name: "a server that does not remember ends", answers: []func() (any, error){lostLeadership, notFoundBare}, wantUnknown: true},
		{name: "a server that forgot this end", answers: []func() (any, error){lostLeadership, notFoundForgotten}, wantUnknown: true},
		{name: "no answer ever", answers: []func() (any, error){lostLeadership, serverTimedOut}, wantUnknown: true, deadlineShort: true},
		{name: "unknown, then no leader until the deadline", answers: []func() (any, error){lostLeadership, notLeaderNoHint}, wantUnknown: true, deadlineShort: true},
		{name: "never proposed: NotFound is definite", answers: []func() (any, error){notLeaderNoHint, notFoundBare}, wantNotFound: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeLeases{answers: tt.answers}
			c := newClient(t, []string{serveLeases(t, f)}, nil)
			ctx := ctxT(t)
			if tt.deadlineShort {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, 500*time.Millisecond)
				defer cancel()
			}
			err := c.Release(ctx, "r", 5)
			if f.calls < 2 {
				t.Fatalf("the server was called %d times; the SDK must retry an unknown outcome", f.calls)
			}
			switch {
			case tt.wantOK:
				if err != nil {
					t.Fatalf("release = %v, want success: the first attempt released it", err)
				}
			case tt.wantUnknown:
				if !errors.Is(err, client.ErrOutcomeUnknown) || errors.Is(err, client.ErrNotFound) {
					t.Fatalf("release = %v, want ErrOutcomeUnknown and not ErrNotFound", err)
				}
				if !errors.Is(err, client.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("release = %v: ErrOutcomeUnknown should wrap the unanswered attempt's error", err)
				}
			case tt.wantNotFound:
				var ended *client.EndedError
				if !errors.Is(err, client.ErrNotFound) || errors.Is(err, client.ErrOutcomeUnknown) {
					t.Fatalf("release = %v, want a definite ErrNotFound", err)
				}
				if tt.wantExpired && (!errors.As(err, &ended) || !ended.Expired || ended.Index != 8) {
					t.Fatalf("release = %#v, want an *EndedError saying it expired at 8", err)
				}
			}
		})
	}
}

func TestRenewAfterAnUnknownOutcome(t *testing.T) {
	// A renewal never ends a lease: NotFound after an unknown outcome is still definite.
	f := &fakeLeases{answers: []func() (any, error){lostLeadership, notFoundBare}}
	c := newClient(t, []string{serveLeases(t, f)}, nil)
	if _, err := c.Renew(ctxT(t), "r", 5); !errors.Is(err, client.ErrNotFound) || errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("renew = %v, want ErrNotFound", err)
	}
	f = &fakeLeases{answers: []func() (any, error){lostLeadership, renewed}}
	c = newClient(t, []string{serveLeases(t, f)}, nil)
	if ttl, err := c.Renew(ctxT(t), "r", 5); err != nil || ttl != 5*time.Second {
		t.Fatalf("renew = %v, %v; want 5s", ttl, err)
	}
	f = &fakeLeases{answers: []func() (any, error){serverTimedOut}}
	c = newClient(t, []string{serveLeases(t, f)}, nil)
	ctx, cancel := context.WithTimeout(ctxT(t), 500*time.Millisecond)
	defer cancel()
	if _, err := c.Renew(ctx, "r", 5); !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("renew that never got an answer = %v, want ErrOutcomeUnknown", err)
	}
}

// A write that never reached any node cannot have taken effect: that is ErrUnavailable, not unknown.
func TestWriteThatReachedNoNodeIsUnavailableNotUnknown(t *testing.T) {
	addr := loopback.ReservePort(t).Addr // nothing listens there: connections are refused
	c := newClient(t, []string{addr}, nil)
	ctx, cancel := context.WithTimeout(ctxT(t), 500*time.Millisecond)
	defer cancel()
	err := c.Release(ctx, "r", 5)
	if !errors.Is(err, client.ErrUnavailable) || errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("release against no server = %v, want ErrUnavailable (not sent, so not unknown)", err)
	}
}

// TestAcquireWithAnUnknownOutcomeNamesItsRequestID: an Acquire whose outcome stays unknown gives the
// request id the SDK drew for it (OutcomeRequestID, and in its message), the one every attempt carried,
// so the caller can ask again about that grant; an Acquire WithRequestID(id) then sends that id.
func TestAcquireWithAnUnknownOutcomeNamesItsRequestID(t *testing.T) {
	f := &fakeLeases{answers: []func() (any, error){lostLeadership, serverTimedOut}}
	c := newClient(t, []string{serveLeases(t, f)}, nil)
	ctx, cancel := context.WithTimeout(ctxT(t), 500*time.Millisecond)
	defer cancel()
	_, err := c.Acquire(ctx, "r", client.WithTTL(5*time.Second))
	if !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("acquire = %v, want ErrOutcomeUnknown", err)
	}
	id, ok := client.OutcomeRequestID(err)
	f.mu.Lock()
	sent := append([]string(nil), f.acquired...)
	f.mu.Unlock()
	if !ok || id == "" || len(sent) < 2 {
		t.Fatalf("OutcomeRequestID = %q, %v after %d attempts; want the call's id", id, ok, len(sent))
	}
	for _, s := range sent {
		if s != id {
			t.Fatalf("attempts carried %q, OutcomeRequestID says %q", sent, id)
		}
	}
	if !strings.Contains(err.Error(), id) {
		t.Fatalf("the message %q does not name the request id %q", err, id)
	}

	f.mu.Lock()
	f.answers, f.calls = []func() (any, error){func() (any, error) {
		return &leasepb.AcquireResponse{Lease: &leasepb.Lease{Resource: "r", Token: 7, TtlMs: 5000, RemainingMs: 4000}, Replayed: true}, nil
	}}, 0
	f.mu.Unlock()
	l, err := c.Acquire(ctxT(t), "r", client.WithTTL(5*time.Second), client.WithRequestID(id))
	if err != nil || l.Token() != 7 {
		t.Fatalf("acquire again with the id = %v, %v; want the replayed grant 7", l, err)
	}
	f.mu.Lock()
	last := f.acquired[len(f.acquired)-1]
	f.mu.Unlock()
	if last != id {
		t.Fatalf("the second call sent request id %q, want %q", last, id)
	}

	// A grant whose renewal (made before Acquire returns, the grant being short of time) goes unanswered:
	// the SDK does not hold it, so the Acquire's outcome is open too and names its id.
	shortGrant := func() (any, error) {
		return &leasepb.AcquireResponse{Lease: &leasepb.Lease{Resource: "r", Token: 8, TtlMs: 5000, RemainingMs: 500}, Replayed: true}, nil
	}
	f3 := &fakeLeases{answers: []func() (any, error){shortGrant, lostLeadership, serverTimedOut}}
	c3 := newClient(t, []string{serveLeases(t, f3)}, nil)
	gctx, gcancel := context.WithTimeout(ctxT(t), 500*time.Millisecond)
	defer gcancel()
	_, err = c3.Acquire(gctx, "r", client.WithTTL(5*time.Second), client.WithRequestID("mine"))
	if got, ok := client.OutcomeRequestID(err); !errors.Is(err, client.ErrOutcomeUnknown) || !ok || got != "mine" {
		t.Fatalf("acquire whose grant's renewal went unanswered = %v; OutcomeRequestID %q, %v; want ErrOutcomeUnknown naming \"mine\"", err, got, ok)
	}

	// Other errors carry none: a Release's unknown outcome, a plain refusal.
	if _, ok := client.OutcomeRequestID(errors.New("x")); ok {
		t.Fatal("OutcomeRequestID of an unrelated error says ok")
	}
	f2 := &fakeLeases{answers: []func() (any, error){serverTimedOut}}
	c2 := newClient(t, []string{serveLeases(t, f2)}, nil)
	rctx, rcancel := context.WithTimeout(ctxT(t), 300*time.Millisecond)
	defer rcancel()
	if err := c2.Release(rctx, "r", 5); !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("release = %v, want ErrOutcomeUnknown", err)
	} else if _, ok := client.OutcomeRequestID(err); ok {
		t.Fatalf("a release's unknown outcome names a request id: %v", err)
	}
}
