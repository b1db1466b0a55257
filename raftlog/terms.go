package raftlog

import (
	"slices"
	"sort"
)

// termIndex remembers the term of every index in [offset, last] as runs of
// equal terms. Terms change only on leader elections, so a whole log needs a
// handful of runs, and Term never touches the disk.
type termIndex struct {
	runs []termRun // sorted by start; runs[0].start is the log's offset
}

// termRun says that indexes from start up to the next run's start have term.
type termRun struct {
	start, term uint64
}

// resetTo forgets everything and records the single index i with term t.
func (x *termIndex) resetTo(i, t uint64) { x.runs = []termRun{{i, t}} }

// offset is the first index the index knows (the log's dummy entry).
func (x *termIndex) offset() uint64 { return x.runs[0].start }

// term returns the term of i; the caller ensures offset <= i <= last.
func (x *termIndex) term(i uint64) uint64 {
	n := sort.Search(len(x.runs), func(k int) bool { return x.runs[k].start > i })
	return x.runs[n-1].term
}

// truncate forgets every index >= i; the caller ensures i > offset.
func (x *termIndex) truncate(i uint64) {
	n := sort.Search(len(x.runs), func(k int) bool { return x.runs[k].start >= i })
	x.runs = x.runs[:n]
}

// add records term t for the index after the current last one.
func (x *termIndex) add(i, t uint64) {
	if x.runs[len(x.runs)-1].term != t {
		x.runs = append(x.runs, termRun{i, t})
	}
}

// compact makes i the new offset; the caller ensures offset < i <= last.
func (x *termIndex) compact(i uint64) {
	n := sort.Search(len(x.runs), func(k int) bool { return x.runs[k].start > i })
	runs := append([]termRun(nil), x.runs[n-1:]...)
	runs[0].start = i
	x.runs = runs
}

// setOffsetTerm sets the offset's term to t, learned late (a provisional
// replay's base or compaction record); the indexes after the offset up to
// last keep the term they have. The offset's run may cover them too: its
// term is split off for them first, or they would change with it.
func (x *termIndex) setOffsetTerm(t, last uint64) {
	first := x.runs[0]
	if first.term == t {
		return
	}
	coversMore := (len(x.runs) == 1 && last > first.start) || (len(x.runs) > 1 && x.runs[1].start > first.start+1)
	if coversMore {
		x.runs = slices.Insert(x.runs, 1, termRun{first.start + 1, first.term})
	}
	x.runs[0].term = t
}

// clone returns a copy that shares nothing with x.
func (x termIndex) clone() termIndex {
	return termIndex{runs: append([]termRun(nil), x.runs...)}
}
