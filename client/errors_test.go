package client_test

import (
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/client"
)

// FromStatus gives a raw API error the SDK's shape: the sentinels hold and the details become the typed
// errors; anything else passes through.
func TestFromStatusMapsRawAPIErrors(t *testing.T) {
	held, err := status.New(codes.FailedPrecondition, "held").WithDetails(&leasepb.LeaseHeld{Resource: "a", Holder: "alice", Token: 7})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		in   error
		want error
	}{
		{status.Error(codes.Unavailable, "no leader"), client.ErrUnavailable},
		{status.Error(codes.NotFound, "no such lease"), client.ErrNotFound},
		{status.Error(codes.ResourceExhausted, "too many leases"), client.ErrLimit},
		{status.Error(codes.InvalidArgument, "ttl_ms: too short"), client.ErrInvalid},
		{status.Error(codes.PermissionDenied, "no"), client.ErrPermissionDenied},
		{held.Err(), client.ErrHeld},
	} {
		if got := client.FromStatus(c.in); !errors.Is(got, c.want) {
			t.Errorf("FromStatus(%v) = %v, want %v", c.in, got, c.want)
		}
	}
	var h *client.HeldError
	if !errors.As(client.FromStatus(held.Err()), &h) || h.Holder != "alice" || h.Token != 7 {
		t.Errorf("held: %+v", h)
	}
	plain := errors.New("plain")
	if client.FromStatus(plain) != plain || client.FromStatus(nil) != nil {
		t.Error("a non-status error or nil was changed")
	}
}
