package client

import (
	"testing"
	"time"
)

// A waiting attempt asks the cluster to end its wait a tenth of the time left before the caller's
// deadline, no less than 100 ms and no more than a second before it, and never asks for no end at all.
func TestWaitMsBeforeLeavesRoomForTheAnswer(t *testing.T) {
	now := time.Unix(1_000, 0)
	for _, tc := range []struct {
		left time.Duration
		want int64
	}{
		{time.Hour, (time.Hour - time.Second).Milliseconds()},
		{10 * time.Second, 9_000},
		{2 * time.Second, 1_800},
		{time.Second, 900},
		{500 * time.Millisecond, 400},
		{100 * time.Millisecond, 1},
		{20 * time.Millisecond, 1},
		{-time.Second, 1}, // a retry sent after the deadline passed
	} {
		if got := waitMsBefore(now.Add(tc.left), now); got != tc.want {
			t.Errorf("%v before the deadline: wait_ms %d, want %d", tc.left, got, tc.want)
		}
	}
}
