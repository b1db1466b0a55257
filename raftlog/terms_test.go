package raftlog

import "testing"

// TestSetOffsetTermKeepsTheTermsAfterIt: the offset's term changes alone,
// whether its run covers later indexes or not, and whatever runs follow.
func TestSetOffsetTermKeepsTheTermsAfterIt(t *testing.T) {
	for _, tc := range []struct {
		name string
		runs []termRun
		last uint64
	}{
		{"the offset alone", []termRun{{5, 1}}, 5},
		{"one run past the offset", []termRun{{5, 1}}, 8},
		{"a run of the offset alone, then another", []termRun{{5, 1}, {6, 3}}, 8},
		{"a longer first run, then another", []termRun{{5, 1}, {7, 3}}, 8},
	} {
		x := termIndex{runs: append([]termRun(nil), tc.runs...)}
		before := termIndex{runs: append([]termRun(nil), tc.runs...)}
		x.setOffsetTerm(2, tc.last)
		if got := x.term(5); got != 2 {
			t.Errorf("%s: the offset's term is %d, want 2", tc.name, got)
		}
		for i := uint64(6); i <= tc.last; i++ {
			if got, want := x.term(i), before.term(i); got != want {
				t.Errorf("%s: term(%d) = %d after setting the offset's, want %d", tc.name, i, got, want)
			}
		}
	}
}
