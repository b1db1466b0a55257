package main

import (
	"io"
	"log/slog"
	"math"
	"os"
	"runtime/debug"
	"testing"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// A container's memory limit becomes 90% of it as the Go memory limit, unless the operator set
// GOMEMLIMIT or AUTOMEMLIMIT=off; AUTOMEMLIMIT picks another share; no container limit changes nothing.
func TestContainerLimitBecomesTheMemoryLimit(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	const container = 1 << 30
	for _, c := range []struct {
		name, gomemlimit, automemlimit string
		provider                       memlimit.Provider
		want                           int64
	}{
		{"container limit", "", "", memlimit.Limit(container), container * 9 / 10},
		{"another share", "", "0.5", memlimit.Limit(container), container / 2},
		{"GOMEMLIMIT set", "3GiB", "", memlimit.Limit(container), 123 << 20},
		{"turned off", "", "off", memlimit.Limit(container), 123 << 20},
		{"no container limit", "", "", func() (uint64, error) { return 0, memlimit.ErrNoLimit }, math.MaxInt64},
	} {
		debug.SetMemoryLimit(123 << 20) // what the runtime would have: leased must leave it, or replace it
		t.Setenv("GOMEMLIMIT", c.gomemlimit)
		t.Setenv("AUTOMEMLIMIT", c.automemlimit)
		if c.automemlimit == "" {
			unsetenv(t, "AUTOMEMLIMIT")
		}
		limitToContainer(log, c.provider)
		if got := debug.SetMemoryLimit(-1); got != c.want {
			t.Errorf("%s: memory limit %d, want %d", c.name, got, c.want)
		}
	}
}

// unsetenv removes key from the environment for the rest of the test (t.Setenv restores it afterwards).
func unsetenv(t *testing.T, key string) {
	t.Helper()
	t.Setenv(key, "")
	if err := os.Unsetenv(key); err != nil {
		t.Fatal(err)
	}
}
