package fence_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/leased/leased/client/fence"
)

func TestStaleTokenErrorMatchesSentinel(t *testing.T) {
	err := fmt.Errorf("write orders: %w", fence.Stale("orders", 3, 7))
	if !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("errors.Is(%v, ErrStaleToken) = false", err)
	}
	var stale *fence.StaleTokenError
	if !errors.As(err, &stale) {
		t.Fatalf("errors.As(%v, *StaleTokenError) = false", err)
	}
	if stale.Resource != "orders" || stale.Token != 3 || stale.Highest != 7 {
		t.Fatalf("got %+v", stale)
	}
	if errors.Is(err, fence.ErrInvalidToken) {
		t.Fatalf("stale error matches ErrInvalidToken")
	}
}

func TestCheck(t *testing.T) {
	tests := []struct {
		token, highest uint64
		ok             bool
	}{
		{1, 0, true},
		{5, 5, true},
		{6, 5, true},
		{4, 5, false},
		{fence.MaxToken, fence.MaxToken - 1, true},
	}
	for _, tt := range tests {
		err := fence.Check("r", tt.token, tt.highest)
		if (err == nil) != tt.ok {
			t.Errorf("Check(r, %d, %d) = %v, want ok=%v", tt.token, tt.highest, err, tt.ok)
		}
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		resource string
		token    uint64
		want     error
	}{
		{"r", 1, nil},
		{"r", fence.MaxToken, nil},
		{"", 1, fence.ErrInvalidResource},
		{"r", 0, fence.ErrInvalidToken},
		{"r", fence.MaxToken + 1, fence.ErrInvalidToken},
	}
	for _, tt := range tests {
		err := fence.Validate(tt.resource, tt.token)
		if tt.want == nil && err != nil || tt.want != nil && !errors.Is(err, tt.want) {
			t.Errorf("Validate(%q, %d) = %v, want %v", tt.resource, tt.token, err, tt.want)
		}
	}
}
