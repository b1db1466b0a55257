package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leased/leased/server"
)

// testSnapshot saves a snapshot through the binary, checks status agrees with save (table and JSON),
// that a damaged file is refused with the reason, and that restore writes a data dir only where none is.
func testSnapshot(t *testing.T, eps []string) {
	want(t, ctl(t, eps, "acquire", "snap/a", "--ttl", "1m", "--holder", "alice"), 0)
	dir := t.TempDir()
	file := filepath.Join(dir, "leased.snap")
	saved := mustJSON[snapshotJSON](t, want(t, ctl(t, eps, "-o", "json", "snapshot", "save", file), 0).stdout)
	fi, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	if saved.File != file || saved.SizeBytes != fi.Size() || saved.Leases < 1 || saved.AppliedIndex == 0 || len(saved.SHA256) != 64 ||
		len(saved.ClusterID) != 16 || saved.Generation != 0 {
		t.Fatalf("save: %+v (file of %d bytes)", saved, fi.Size())
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("save left %d files in its directory, want only the snapshot", len(entries))
	}
	status := mustJSON[snapshotJSON](t, want(t, ctl(t, eps, "-o", "json", "snapshot", "status", file), 0).stdout)
	if status != saved {
		t.Fatalf("status %+v differs from save %+v", status, saved)
	}
	table := want(t, ctl(t, eps, "snapshot", "status", file), 0).stdout
	if !strings.Contains(table, "CLUSTER") || !strings.Contains(table, "GENERATION") || !strings.Contains(table, saved.ClusterID) ||
		!strings.Contains(table, "APPLIED INDEX") || !strings.Contains(table, saved.SHA256) {
		t.Fatalf("status table: %q", table)
	}

	data, _ := os.ReadFile(file)
	data[len(data)/2] ^= 0xff
	bad := filepath.Join(dir, "bad.snap")
	if err := os.WriteFile(bad, data, 0o600); err != nil {
		t.Fatal(err)
	}
	r := want(t, ctl(t, eps, "snapshot", "status", bad), 1)
	if !strings.Contains(r.stderr, "not a valid leased snapshot") || !strings.Contains(r.stderr, "checksum") {
		t.Fatalf("status of a damaged file: %v", r)
	}
	if err := os.WriteFile(bad, data[:10], 0o600); err != nil {
		t.Fatal(err)
	}
	if r := want(t, ctl(t, eps, "snapshot", "status", bad), 1); !strings.Contains(r.stderr, "shorter than") {
		t.Fatalf("status of a truncated file: %v", r)
	}
	want(t, ctl(t, eps, "snapshot", "status", filepath.Join(dir, "missing")), 1)

	restore := func(dataDir string, extra ...string) result {
		return ctl(t, eps, append([]string{"-o", "json", "snapshot", "restore", file, "--name", "r1", "--data-dir", dataDir,
			"--initial-cluster", "r1=127.0.0.1:1,r2=127.0.0.1:2"}, extra...)...)
	}
	// The default floor is read from the clock, and restore prints it with what the other members need.
	before := server.DefaultTokenFloor(time.Now())
	r1 := want(t, restore(filepath.Join(dir, "r1")), 0)
	out := mustJSON[restoreJSON](t, r1.stdout)
	if out.TokenFloor < before || out.TokenFloor > server.DefaultTokenFloor(time.Now()) || out.Leases != saved.Leases ||
		len(out.ClusterID) != 16 || out.ClusterID == saved.ClusterID || out.Generation != 1 {
		t.Fatalf("restore: %+v (the backup: %+v)", out, saved)
	}
	floor := strconv.FormatUint(out.TokenFloor, 10)
	if !strings.Contains(r1.stderr, "--token-floor "+floor) {
		t.Fatalf("restore of one of two members does not say which floor to give the other: %v", r1)
	}
	second := want(t, ctl(t, eps, "snapshot", "restore", file, "--name", "r2", "--data-dir", filepath.Join(dir, "r2"),
		"--initial-cluster", "r1=127.0.0.1:1,r2=127.0.0.1:2", "--token-floor", floor), 0)
	if !strings.Contains(second.stdout, "TOKEN FLOOR") || !strings.Contains(second.stdout, floor) ||
		!strings.Contains(second.stdout, out.ClusterID) || second.stderr != "" {
		t.Fatalf("restore of the second member with the first one's floor: %v", second)
	}
	if r := want(t, restore(filepath.Join(dir, "r1")), 1); !strings.Contains(r.stderr, "not empty") {
		t.Fatalf("restore over a data dir: %v", r)
	}
	if r := want(t, restore(filepath.Join(dir, "r3"), "--token-floor", "1"), 2); !strings.Contains(r.stderr, "token floor") {
		t.Fatalf("restore below the applied index: %v", r)
	}
}
