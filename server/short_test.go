package server_test

import "testing"

// skipShort skips t under -short (make test-short, the inner loop): t starts nodes in this process, as
// servertest's clusters do, which only the full run (make test) starts.
func skipShort(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts nodes: skipped under -short (make test-short); make test runs it")
	}
}
