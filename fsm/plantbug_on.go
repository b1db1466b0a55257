//go:build plantbug

package fsm

// plantedReleaseIgnoresToken plants a bug for tests/chaos: Release frees the resource whatever token it
// carries. Built only with -tags plantbug; the chaos checkers must catch it.
const plantedReleaseIgnoresToken = true
