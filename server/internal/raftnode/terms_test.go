package raftnode

import (
	"math"
	"testing"
	"time"

	"github.com/leased/leased/server/internal/clock"
)

func TestTermGuardBoundsJumpsNotElections(t *testing.T) {
	clk := clock.NewManual()
	g := NewTermGuard(clk, 7)
	for _, c := range []struct {
		term uint64
		want bool
	}{
		{0, true}, {7, true}, {8, true}, // older, own, the next election
		{7 + 1<<32, true}, {7 + 1<<32 + 1, false}, // the allowance of a node that just started
		{1<<62 - 1, false}, {1 << 63, false}, {math.MaxUint64, false},
	} {
		if got := g.AcceptTerm(c.term); got != c.want {
			t.Errorf("term %d at own term 7: accepted %v, want %v", c.term, got, c.want)
		}
	}
	// The next term is accepted at any term below the ceiling: a node that reached a high term still elects.
	g.Observe(TermCeiling - 2)
	if !g.AcceptTerm(TermCeiling-1) || g.AcceptTerm(TermCeiling) {
		t.Error("at the top of the range, the next term must be accepted and the ceiling refused")
	}
}

// Forged messages, as many as the allowance lets through, move a node's term by at most maxTermJump a
// second (and one per message, the next term's): the top of the range is decades away.
func TestTermGuardRatchetIsBoundedByTime(t *testing.T) {
	clk := clock.NewManual()
	g := NewTermGuard(clk, 1)
	own := uint64(1)
	const seconds, perSecond = 30, 1000
	for range seconds {
		for range perSecond {
			// The largest term the guard takes, found by halving (acceptTerm is monotone above own+1).
			lo, hi := own+1, uint64(TermCeiling)
			for lo+1 < hi {
				if mid := lo + (hi-lo)/2; g.AcceptTerm(mid) {
					lo = mid
				} else {
					hi = mid
				}
			}
			own = lo
			g.Observe(own)
		}
		clk.Advance(time.Second)
	}
	if limit := uint64(1) + maxTermJump*(seconds+1) + seconds*perSecond; own > limit {
		t.Fatalf("%d forged messages over %d s took the term to %d, beyond %d", seconds*perSecond, seconds, own, limit)
	}
}

// A node left behind by others' jumps (it dropped them, or was down) accepts their term once it has held
// its own long enough: the gap closes a second per maxTermJump, and nobody is left behind for good.
func TestTermGuardLetsALaggingNodeCatchUp(t *testing.T) {
	clk := clock.NewManual()
	g := NewTermGuard(clk, 5)
	others := uint64(5 + 4*maxTermJump + 3) // the cluster, jumped and then elected three times
	for s := 0; !g.AcceptTerm(others); s++ {
		if s > 5 {
			t.Fatalf("term %d still refused after %d s at term 5", others, s)
		}
		clk.Advance(time.Second)
	}
}

func TestTermAllowanceSaturates(t *testing.T) {
	if got := termAllowance(math.MaxUint64-3, time.Hour); got != math.MaxUint64 {
		t.Errorf("allowance near the top: %d", got)
	}
	if got := termAllowance(0, time.Duration(math.MaxInt64)); got != math.MaxUint64 {
		t.Errorf("allowance after centuries: %d", got)
	}
	if got := termAllowance(10, -time.Second); got != 10+maxTermJump {
		t.Errorf("allowance with a clock step back: %d", got)
	}
}
