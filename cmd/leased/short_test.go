package main

import "testing"

// skipShort skips t under -short (make test-short, the inner loop): t runs a node in this process, which
// only the full run (make test) does.
func skipShort(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs a node: skipped under -short (make test-short); make test runs it")
	}
}
