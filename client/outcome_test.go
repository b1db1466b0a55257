package client_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/client"
)

// fakeLeases is a Leases service that answers Release and Renew from a script, one answer per call;
// the last answer repeats.
type fakeLeases struct {
	leasepb.UnimplementedLeasesServer
	mu      sync.Mutex
	answers []func() (any, error)
	calls   int
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
	return resp.(*leasepb.ReleaseResponse), nil
}

func (f *fakeLeases) Renew(context.Context, *leasepb.RenewRequest) (*leasepb.RenewResponse, error) {
	resp, err := f.next()
	if err != nil {
		return nil, err
	}
	return resp.(*leasepb.RenewResponse), nil
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
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	_ = lis.Close() // nothing listens there now: connections are refused
	c := newClient(t, []string{addr}, nil)
	ctx, cancel := context.WithTimeout(ctxT(t), 500*time.Millisecond)
	defer cancel()
	err = c.Release(ctx, "r", 5)
	if !errors.Is(err, client.ErrUnavailable) || errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("release against no server = %v, want ErrUnavailable (not sent, so not unknown)", err)
	}
}
