package server

import (
	"sync"
	"time"
)

// Clock reads the monotonic clock. The lessor keeps every deadline on it; nothing compares its readings
// across machines. Tests inject a ManualClock so expiry tests do not sleep.
type Clock interface {
	Now() time.Time
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// ManualClock is a Clock that moves only when told to. It is safe for concurrent use.
type ManualClock struct {
	mu  sync.Mutex
	now time.Time
}

// NewManualClock starts a manual clock at an arbitrary fixed instant.
func NewManualClock() *ManualClock {
	return &ManualClock{now: time.Unix(1_000_000, 0)}
}

// Now returns the clock's current reading.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
