package server

import "github.com/leased/leased/server/internal/clock"

// Clock reads the monotonic clock. The lessor keeps every deadline on it; nothing compares its readings
// across machines. Tests inject a ManualClock so expiry tests do not sleep.
type Clock = clock.Clock

// ManualClock is a Clock that moves only when told to. It is safe for concurrent use.
type ManualClock = clock.Manual

// NewManualClock starts a manual clock at an arbitrary fixed instant.
func NewManualClock() *ManualClock { return clock.NewManual() }
