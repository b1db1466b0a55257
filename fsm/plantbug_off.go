//go:build !plantbug

package fsm

// plantedReleaseIgnoresToken is the planted-bug switch of tests/chaos (see plantbug_on.go); always false
// in real builds, so the compiler drops the guarded line.
const plantedReleaseIgnoresToken = false
