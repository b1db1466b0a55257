// Package clienttest holds test helpers for programs and tests that use the client SDK.
package clienttest

import (
	"time"

	"github.com/leased/leased/client"
)

// SkewedClock is a client.Clock that runs at Rate × real time from Start: a client machine whose clock is
// slower (Rate < 1) or faster than the servers'. Its readings keep Go's monotonic clock.
type SkewedClock struct {
	Start time.Time
	Rate  float64
}

// NewSkewedClock starts a clock running at rate × real time from now.
func NewSkewedClock(rate float64) SkewedClock { return SkewedClock{Start: time.Now(), Rate: rate} }

// Now is the skewed reading.
func (c SkewedClock) Now() time.Time {
	return c.Start.Add(time.Duration(float64(time.Since(c.Start)) * c.Rate))
}

// AfterFunc runs f once d has passed on the skewed clock.
func (c SkewedClock) AfterFunc(d time.Duration, f func()) client.Timer {
	return time.AfterFunc(time.Duration(float64(d)/c.Rate), f)
}
