package ids

import "testing"

// TestIDsNeverChange pins the derivations: data dirs and backups record these ids, so a node of a newer
// version must compute the same ones from the same flags, or it would refuse its own data dir and peers.
func TestIDsNeverChange(t *testing.T) {
	initial := map[string]string{"n2": "127.0.0.1:2381", "n1": "127.0.0.1:2380"}
	cluster := Cluster(initial)
	for _, c := range []struct {
		name      string
		got, want uint64
	}{
		{"cluster", cluster, 0x9d8482411031e837},
		{"token cluster", TokenCluster("tok"), 0xac21e8192efdabe1},
		{"member", Member(cluster, "n1"), 0x69db46f6c919ba78},
		{"third incarnation", Incarnation(cluster, "n1", 3), 0xbd209f77819135f7},
	} {
		if c.got != c.want {
			t.Errorf("%s id = %#x, want %#x", c.name, c.got, c.want)
		}
	}
	if !IsIncarnation(cluster, "n1", Incarnation(cluster, "n1", MaxIncarnations-1)) || IsIncarnation(cluster, "n2", Member(cluster, "n1")) {
		t.Error("IsIncarnation does not tell a name's ids from another's")
	}
}
