package main

import (
	"math"
	"testing"
)

func TestGCPercentIsRaisedOnlyUnderALimitWithoutGOGC(t *testing.T) {
	for _, c := range []struct {
		limit   int64
		gogc    string
		percent int
		set     bool
	}{
		{math.MaxInt64, "", 100, false},          // no limit: the runtime's default
		{4 << 30, "", gcPercentUnderLimit, true}, // a limit, no GOGC: collect less often
		{4 << 30, "50", 50, false},               // the operator's GOGC wins
		{4 << 30, "off", -1, false},              // so does GOGC=off
		{math.MaxInt64, "200", 200, false},       // GOGC without a limit
		{4 << 30, "many", 100, false},            // unparsable: the runtime's default, left alone
	} {
		percent, set := gcPercent(c.limit, c.gogc)
		if percent != c.percent || set != c.set {
			t.Errorf("gcPercent(%d, %q) = %d, %v; want %d, %v", c.limit, c.gogc, percent, set, c.percent, c.set)
		}
	}
}
