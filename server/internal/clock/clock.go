// Package clock is the node's monotonic clock and, for tests, a clock that moves only when told to.
package clock

import (
	"sync"
	"time"
)

// Clock reads the monotonic clock. The lessor keeps every deadline on it; nothing compares its readings
// across machines.
type Clock interface {
	Now() time.Time
}

// Real is time.Now.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// Manual is a Clock that moves only when told to. It is safe for concurrent use.
type Manual struct {
	mu  sync.Mutex
	now time.Time
}

// NewManual starts a manual clock at an arbitrary fixed instant.
func NewManual() *Manual {
	return &Manual{now: time.Unix(1_000_000, 0)}
}

// Now returns the clock's current reading.
func (c *Manual) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Manual) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
