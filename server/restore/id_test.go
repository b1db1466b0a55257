package restore

import "testing"

// TestRestoredClusterIDNeverChanges pins the id of a restored cluster: its data dirs record it, so a node
// of a newer version must derive the same one, or the restored members would refuse each other.
func TestRestoredClusterIDNeverChanges(t *testing.T) {
	initial := map[string]string{"n1": "127.0.0.1:2380", "n2": "127.0.0.1:2381"}
	if got, want := restoredClusterID(initial, 1<<50), uint64(0xc32acd9d6719cff); got != want {
		t.Fatalf("restored cluster id = %#x, want %#x", got, want)
	}
	if restoredClusterID(initial, 1<<50) == restoredClusterID(initial, 1<<50+1) {
		t.Fatal("two floors give one cluster id")
	}
}
