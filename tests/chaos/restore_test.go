package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leased/leased/client"
	"github.com/leased/leased/client/fence/memfence"
	"github.com/leased/leased/tests/internal/proc"
)

// ---- the operator's restores: a double-restore scenario, and no token issued twice across incarnations ----
//
// A cluster is backed up twice and lost after granting more. Its newer backup is restored into a new
// cluster, which grants, is backed up and is lost before anyone notices; the same backup is restored
// again, then the older one, then the lost cluster's own backup, twice. Every restore uses the same
// --initial-cluster (one set of addresses, as a StatefulSet or a fixed host list keeps) and the default
// token floor, as an operator would. All along, the holders of a few resources write through one fence
// store that outlives every cluster, as a database does. checkRestores holds every incarnation to
// decision 12 (I1 across restores): each grant's token is above every token granted before it, and the
// fence accepts it. A lower token is refused by the fence (the new holder cannot write), an equal one is
// accepted for a second holder (two holders write).

// restoreResources are the resources every incarnation grants and writes through the fence.
const restoreResources = 3

// restoreGrant is one grant of the scenario and what the fence said to its holder's write.
type restoreGrant struct {
	incarnation      int
	resource, holder string
	token            uint64
	fenceErr         error // nil: the write was accepted
}

// checkRestores checks grants (in the order they were made, incarnation by incarnation): every token is
// above every token of the incarnations before its own, no token went to two holders, and the fence
// accepted every write.
func checkRestores(grants []restoreGrant) []string {
	var v []string
	var top, cur uint64 // the highest token of the earlier incarnations, of the current one
	inc := -1
	owner := map[uint64]string{}
	for _, g := range grants {
		if g.incarnation != inc {
			inc, top = g.incarnation, max(top, cur)
		}
		cur = max(cur, g.token)
		who := fmt.Sprintf("%s on %s", g.holder, g.resource)
		if g.token <= top {
			v = append(v, fmt.Sprintf("incarnation %d granted %s token %d, not above %d granted before it", g.incarnation, who, g.token, top))
		}
		if o, ok := owner[g.token]; ok && o != who {
			v = append(v, fmt.Sprintf("token %d issued twice: to %s and to %s", g.token, o, who))
		}
		owner[g.token] = who
		if g.fenceErr != nil {
			v = append(v, fmt.Sprintf("the fence refused %s's write with token %d: %v", who, g.token, g.fenceErr))
		}
	}
	return v
}

// restoreScenario drives the incarnations with the leasectl and leased binaries.
type restoreScenario struct {
	t      *testing.T
	ctl    string
	dir    string
	store  *memfence.Store
	grants []restoreGrant
	inc    int
}

func newRestoreScenario(t *testing.T) *restoreScenario {
	if testing.Short() {
		t.Skip("multi-process scenario: skipped with -short")
	}
	ctl, err := proc.BuildCommand(buildDir, "leasectl", "")
	if err != nil {
		t.Fatal(err)
	}
	return &restoreScenario{t: t, ctl: ctl, dir: t.TempDir(), store: memfence.New()}
}

// cluster prepares three nodes of the plain leased build on fresh addresses; it starts none.
func (s *restoreScenario) cluster(name string) *proc.Cluster {
	return proc.New(s.t, proc.Config{Bin: leasedBinary(s.t, ""), Dir: filepath.Join(s.dir, name), Size: 3})
}

// run runs leasectl against c's endpoints and returns its stdout; a non-zero exit fails the test.
func (s *restoreScenario) run(c *proc.Cluster, args ...string) string {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.ctl, append([]string{"--endpoints", strings.Join(c.Endpoints(), ",")}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		s.t.Fatalf("leasectl %v: %v\n%s", args, err, errb.String())
	}
	return out.String()
}

// round makes the current incarnation grant each resource to a holder of its own, who writes through
// the fence with the token and releases.
func (s *restoreScenario) round(c *proc.Cluster) {
	s.t.Helper()
	for r := range restoreResources {
		res := fmt.Sprintf("restore/%d", r)
		holder := fmt.Sprintf("i%d-%d-%d", s.inc, r, len(s.grants))
		cl, err := client.New(client.Config{Endpoints: c.Endpoints(), Holder: holder, DialTimeout: time.Second, RequestTimeout: 2 * time.Second})
		if err != nil {
			s.t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		l, err := cl.Acquire(ctx, res, client.WithTTL(30*time.Second), client.WithWait())
		if err != nil {
			cancel()
			cl.Close()
			s.t.Fatalf("incarnation %d: acquire %s: %v", s.inc, res, err)
		}
		werr := l.Fenced(ctx, func(ctx context.Context, token uint64) error {
			return s.store.Write(ctx, res, token, func(tx *memfence.Tx) error {
				tx.Put(res, []byte(holder))
				return nil
			})
		})
		s.grants = append(s.grants, restoreGrant{incarnation: s.inc, resource: res, holder: holder, token: l.Token(), fenceErr: werr})
		if err := l.Release(ctx); err != nil {
			s.t.Logf("incarnation %d: release %s: %v", s.inc, res, err)
		}
		cancel()
		cl.Close()
	}
}

// snapshotInfo is what leasectl snapshot save, status and restore print (-o json) that the scenario reads.
type snapshotInfo struct {
	ClusterID    string `json:"cluster_id"`
	Generation   uint64 `json:"generation"`
	AppliedIndex uint64 `json:"applied_index"`
	TokenFloor   uint64 `json:"token_floor"`
}

func (s *restoreScenario) decode(out string) snapshotInfo {
	s.t.Helper()
	var info snapshotInfo
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		s.t.Fatalf("leasectl printed %q: %v", out, err)
	}
	return info
}

// save backs c up into a new file.
func (s *restoreScenario) save(c *proc.Cluster, name string) (string, snapshotInfo) {
	file := filepath.Join(s.dir, name+".snap")
	return file, s.decode(s.run(c, "-o", "json", "snapshot", "save", file))
}

// lose kills every node of c and wipes their data dirs: the cluster is gone.
func lose(c *proc.Cluster) {
	for i, n := range c.Nodes {
		c.Kill(i)
		_ = os.RemoveAll(n.DataDir)
	}
}

// restore founds the next incarnation on c's addresses from file: the first member with floor (0: the
// default), the others with the floor the first printed, as the runbook says. It starts them and waits
// for a leader, and returns what the first member's restore printed.
func (s *restoreScenario) restore(c *proc.Cluster, file string, floor uint64) snapshotInfo {
	s.t.Helper()
	s.inc++
	var first snapshotInfo
	for i, n := range c.Nodes {
		args := []string{"-o", "json", "snapshot", "restore", file, "--name", n.Name, "--data-dir", n.DataDir,
			"--initial-cluster", c.InitialCluster()}
		if i > 0 {
			floor = first.TokenFloor
		}
		if floor != 0 {
			args = append(args, "--token-floor", strconv.FormatUint(floor, 10))
		}
		info := s.decode(s.run(c, args...))
		if i == 0 {
			first = info
		}
	}
	for i := range c.Nodes {
		c.Start(i)
	}
	if _, _, err := c.WaitLeader(15 * time.Second); err != nil {
		s.t.Fatalf("incarnation %d: %v", s.inc, err)
	}
	return first
}

func (s *restoreScenario) report() {
	s.t.Helper()
	for _, v := range checkRestores(s.grants) {
		s.t.Error(v)
	}
	if s.t.Failed() {
		for _, g := range s.grants {
			s.t.Logf("incarnation %d: %s %s token %d (fence: %v)", g.incarnation, g.resource, g.holder, g.token, g.fenceErr)
		}
	}
}

// TestDoubleRestore runs the scenario with the default floors: no token is granted twice or backwards.
func TestDoubleRestore(t *testing.T) {
	s := newRestoreScenario(t)
	orig := s.cluster("original")
	for i := range orig.Nodes {
		orig.Start(i)
	}
	if _, _, err := orig.WaitLeader(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	s.round(orig)
	older, _ := s.save(orig, "older")
	s.round(orig)
	newer, _ := s.save(orig, "newer")
	s.round(orig) // unknown to both backups
	lose(orig)

	c := s.cluster("restored") // every restore on these addresses, with this --initial-cluster
	var restoredBackup string
	var ids []string
	for _, step := range []struct {
		what string
		file func() string
		gen  uint64
	}{
		{"the newer backup", func() string { return newer }, 1},
		{"the newer backup again", func() string { return newer }, 1},
		{"the older backup", func() string { return older }, 1},
		{"the first restored cluster's backup", func() string { return restoredBackup }, 2},
		{"the first restored cluster's backup again", func() string { return restoredBackup }, 2},
	} {
		info := s.restore(c, step.file(), 0)
		if info.Generation != step.gen {
			t.Errorf("restore of %s: generation %d, want %d", step.what, info.Generation, step.gen)
		}
		ids = append(ids, info.ClusterID)
		s.round(c)
		if restoredBackup == "" {
			var saved snapshotInfo
			restoredBackup, saved = s.save(c, "restored")
			if saved.ClusterID != info.ClusterID || saved.Generation != 1 {
				t.Errorf("backup of the restored cluster %s: cluster %s generation %d, want generation 1", info.ClusterID, saved.ClusterID, saved.Generation)
			}
			s.round(c) // unknown to that backup
		}
		lose(c)
	}
	for i := range ids {
		for j := range i {
			if ids[i] == ids[j] {
				t.Errorf("restores %d and %d made clusters with the same id %s", j+1, i+1, ids[i])
			}
		}
	}
	s.report()
}

// TestDoubleRestoreCatchesPlantedFileFloor plants the floor that is a function of the file alone (the
// backup's applied index + 2^40, given with --token-floor) and expects checkRestores to report the
// second restore's tokens.
func TestDoubleRestoreCatchesPlantedFileFloor(t *testing.T) {
	s := newRestoreScenario(t)
	orig := s.cluster("original")
	for i := range orig.Nodes {
		orig.Start(i)
	}
	if _, _, err := orig.WaitLeader(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	s.round(orig)
	file, saved := s.save(orig, "backup")
	lose(orig)
	c := s.cluster("restored")
	for range 2 {
		s.restore(c, file, saved.AppliedIndex+1<<40)
		s.round(c)
		lose(c)
	}
	v := checkRestores(s.grants)
	if len(v) == 0 {
		t.Fatal("checkRestores found nothing with the planted floor")
	}
	if !strings.Contains(strings.Join(v, "\n"), "not above") {
		t.Fatalf("checkRestores: %v", v)
	}
	t.Logf("planted floor caught:\n%s", strings.Join(v, "\n"))
}

func TestCheckRestores(t *testing.T) {
	g := func(inc int, res, holder string, token uint64, err error) restoreGrant {
		return restoreGrant{incarnation: inc, resource: res, holder: holder, token: token, fenceErr: err}
	}
	good := []restoreGrant{g(0, "a", "x", 3, nil), g(0, "b", "y", 4, nil), g(1, "a", "z", 100, nil), g(2, "a", "w", 200, nil)}
	if v := checkRestores(good); len(v) != 0 {
		t.Fatalf("a good history: %v", v)
	}
	for name, bad := range map[string][]restoreGrant{
		"reissued":  {g(0, "a", "x", 3, nil), g(1, "a", "y", 3, nil)},
		"backwards": {g(0, "a", "x", 300, nil), g(1, "b", "y", 200, nil)},
		"refused":   {g(0, "a", "x", 3, errors.New("stale token"))},
		"twice":     {g(0, "a", "x", 3, nil), g(0, "b", "y", 3, nil)},
	} {
		if v := checkRestores(bad); len(v) == 0 {
			t.Errorf("%s: no violation found", name)
		}
	}
}
