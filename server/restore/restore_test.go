package restore_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server/restore"
)

// backup is a backup's bytes as the Snapshot RPC streams them (the state machine's snapshot) of a
// cluster that granted three leases, and its applied index.
func backup(t *testing.T) ([]byte, uint64) {
	t.Helper()
	sm := fsm.New()
	var index uint64
	for _, r := range []string{"a", "b", "c"} {
		index++
		cmd := &wirepb.Command{Op: &wirepb.Command_Acquire{Acquire: &wirepb.AcquireCmd{
			Resource: r, Holder: "h-" + r, TtlMs: 60_000, Value: []byte("v-" + r), RequestId: "q-" + r,
		}}}
		if res, err := sm.Apply(index, cmd); err != nil || res.Code != fsm.OK {
			t.Fatalf("acquire %s: %v, %v", r, res.Code, err)
		}
	}
	data, err := sm.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	return data, index
}

func TestRestoreRefusesBadInput(t *testing.T) {
	data, index := backup(t)
	dir := t.TempDir()
	cluster := map[string]string{"r1": "127.0.0.1:1", "r2": "127.0.0.1:2"}
	base := restore.Config{Snapshot: data, Name: "r1", DataDir: filepath.Join(dir, "r1"), InitialCluster: cluster}

	full := filepath.Join(dir, "full")
	if err := os.MkdirAll(full, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(full, "keep"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	corrupt := append([]byte(nil), data...)
	corrupt[len(corrupt)-1] ^= 0xff
	// A backup of a cluster restored with a floor far above the clock (an explicit --token-floor, or
	// a restore on a machine whose clock ran ahead): the default floor cannot be trusted to exceed it.
	ahead := fsm.New()
	if err := ahead.Rebase(1<<52, nil); err != nil {
		t.Fatal(err)
	}
	aheadData, err := ahead.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	// A backup of a cluster restored an hour ago, restored again on a machine whose clock is an hour
	// behind the first one's.
	restoredAt := time.Now()
	later := fsm.New()
	if err := later.Rebase(restore.DefaultTokenFloor(restoredAt)+5, nil); err != nil {
		t.Fatal(err)
	}
	laterData, err := later.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		mutate func(*restore.Config)
		want   error
	}{
		{"non-empty data dir", func(c *restore.Config) { c.DataDir = full }, restore.ErrDataDirNotEmpty},
		{"name not in the cluster", func(c *restore.Config) { c.Name = "r9" }, restore.ErrInvalid},
		{"floor below the index", func(c *restore.Config) { c.TokenFloor = index - 1 }, restore.ErrInvalid},
		{"floor beyond int64/2", func(c *restore.Config) { c.TokenFloor = restore.MaxTokenFloor + 1 }, restore.ErrInvalid},
		{"corrupted backup", func(c *restore.Config) { c.Snapshot = corrupt }, fsm.ErrBadSnapshot},
		{"default floor below the backup", func(c *restore.Config) { c.Snapshot = aheadData }, restore.ErrClockBehind},
		{"clock set back behind a restore", func(c *restore.Config) {
			c.Snapshot, c.Now = laterData, func() time.Time { return restoredAt.Add(-time.Hour) }
		}, restore.ErrClockBehind},
	}
	for _, tc := range cases {
		c := base
		tc.mutate(&c)
		if _, err := restore.DataDir(c); !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
		}
	}
	if _, err := os.Stat(base.DataDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused restore left %s: %v", base.DataDir, err)
	}
	if b, err := os.ReadFile(filepath.Join(full, "keep")); err != nil || string(b) != "x" {
		t.Fatal("a refused restore touched the non-empty data dir")
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.Contains(e.Name(), ".restore-") {
			t.Fatalf("a refused restore left %s behind", e.Name())
		}
	}
}

// An existing empty directory (a mount point, a fresh volume) is a fine target; so is a missing parent.
func TestRestoreIntoAnEmptyDirectory(t *testing.T) {
	data, index := backup(t)
	for _, dir := range []string{t.TempDir(), filepath.Join(t.TempDir(), "a", "b")} {
		before := restore.DefaultTokenFloor(time.Now())
		info, err := restore.DataDir(restore.Config{Snapshot: data, Name: "r1", DataDir: dir,
			InitialCluster: map[string]string{"r1": "127.0.0.1:1"}})
		if err != nil {
			t.Fatalf("restore into %s: %v", dir, err)
		}
		if after := restore.DefaultTokenFloor(time.Now()); info.TokenFloor < before || info.TokenFloor > after || !info.DefaultFloor {
			t.Fatalf("default floor %d, want the clock's in [%d, %d]", info.TokenFloor, before, after)
		}
		if info.TokenFloor < index+restore.DefaultTokenFloorBump || info.TokenFloor >= 1<<53 {
			t.Fatalf("default floor %d: below the index %d + 2^40, or beyond 2^53", info.TokenFloor, index)
		}
		for _, name := range []string{"raft.db", "wal"} { // the raft log: raft.db and its WAL directory
			if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// The default floor is the clock's, exactly, and a backup of a restored cluster restored an hour later
// starts an hour's microseconds above that cluster's floor.
func TestDefaultFloorFollowsTheClock(t *testing.T) {
	restoredAt := time.Now()
	sm := fsm.New()
	if err := sm.Rebase(restore.DefaultTokenFloor(restoredAt)+5, nil); err != nil { // a restored cluster's backup
		t.Fatal(err)
	}
	data, err := sm.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	now := restoredAt.Add(time.Hour)
	info, err := restore.DataDir(restore.Config{Snapshot: data, Name: "r1", DataDir: t.TempDir(),
		InitialCluster: map[string]string{"r1": "127.0.0.1:1"}, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	want := uint64(now.UnixMicro()) + restore.DefaultTokenFloorBump
	if info.TokenFloor != want || !info.DefaultFloor || info.Generation != 2 {
		t.Fatalf("restore an hour later: %+v, want floor %d and generation 2", info, want)
	}
	if info.TokenFloor-sm.AppliedIndex() < uint64(time.Hour.Microseconds())-5 {
		t.Fatalf("floor %d is not an hour's microseconds above the backup's index %d", info.TokenFloor, sm.AppliedIndex())
	}
}
