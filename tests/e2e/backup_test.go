package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/tests/internal/proc"
)

// ctlRun runs leasectl to completion (at most 30 s) and returns its exit code, stdout and stderr.
func ctlRun(t *testing.T, endpoints []string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, leasectlBin, append([]string{"--endpoints", strings.Join(endpoints, ",")}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if cmd.ProcessState == nil {
		t.Fatalf("leasectl %v: %v", args, err)
	}
	return cmd.ProcessState.ExitCode(), out.String(), errb.String()
}

// acquireValue acquires with a value, retrying through node target like retrier.acquire.
func (r *retrier) acquireValue(resource, holder, requestID, value string) (*leasepb.Lease, error) {
	var lease *leasepb.Lease
	_, err := r.do(func(ctx context.Context, c leasepb.LeasesClient) error {
		resp, err := c.Acquire(ctx, &leasepb.AcquireRequest{Resource: resource, Holder: holder, RequestId: requestID,
			TtlMs: (10 * time.Minute).Milliseconds(), Value: []byte(value)})
		lease = resp.GetLease()
		return err
	})
	return lease, err
}

// TestBackupAndRestore is the runbook of docs/operations.md, "Back up and restore", against real
// processes: snapshot save from a running cluster, which keeps granting afterwards; snapshot restore into
// a new three-node cluster on other ports; every lease of the snapshot back with its holder, value and
// token; and every token the new cluster grants above every token the old one granted, including those
// granted after the snapshot (decision 12, I1 across restores).
func TestBackupAndRestore(t *testing.T) {
	old := newCluster(t, 3)
	r := newRetrier(old, 0)
	before := map[string]*leasepb.Lease{}
	for i := range 5 {
		res := fmt.Sprintf("backup/r%d", i)
		l, err := r.acquireValue(res, fmt.Sprintf("holder-%d", i), "req-"+res, "value-"+res)
		if err != nil {
			t.Fatalf("acquire %s: %v", res, err)
		}
		before[res] = l
	}
	file := filepath.Join(t.TempDir(), "leased.snap")
	code, stdout, stderr := ctlRun(t, old.Endpoints(), "-o", "json", "snapshot", "save", file)
	if code != 0 {
		t.Fatalf("snapshot save exited %d: %s", code, stderr)
	}
	var saved struct {
		AppliedIndex uint64 `json:"applied_index"`
		Leases       int    `json:"leases"`
	}
	if err := json.Unmarshal([]byte(stdout), &saved); err != nil || saved.Leases != len(before) {
		t.Fatalf("snapshot save printed %q (%v), want %d leases", stdout, err, len(before))
	}

	// The old cluster keeps granting after the backup: these tokens are unknown to the snapshot.
	var maxOld uint64
	for i := range 20 {
		res := fmt.Sprintf("backup/after%d", i%4)
		resp, _, err := r.acquire(res, "late", fmt.Sprintf("late-%d", i), time.Minute)
		if err != nil {
			t.Fatalf("acquire %s after the backup: %v", res, err)
		}
		tok := resp.GetLease().GetToken()
		maxOld = max(maxOld, tok)
		if err := r.release(res, tok); err != nil {
			t.Fatalf("release %s: %v", res, err)
		}
	}
	if maxOld <= saved.AppliedIndex {
		t.Fatalf("the old cluster's tokens after the backup (%d) are not above its index %d", maxOld, saved.AppliedIndex)
	}

	// The first member takes the default floor; the others are given the one it printed.
	restored := prepareCluster(t, 3)
	var floor []string
	for _, n := range restored.Nodes {
		code, stdout, stderr := ctlRun(t, old.Endpoints(), append([]string{"-o", "json", "snapshot", "restore", file, "--name", n.Name,
			"--data-dir", n.DataDir, "--initial-cluster", restored.InitialCluster()}, floor...)...)
		if code != 0 {
			t.Fatalf("restore %s exited %d: %s", n.Name, code, stderr)
		}
		var out struct {
			TokenFloor uint64 `json:"token_floor"`
		}
		if err := json.Unmarshal([]byte(stdout), &out); err != nil || out.TokenFloor <= maxOld {
			t.Fatalf("restore %s printed %q (%v): no floor above %d", n.Name, stdout, err, maxOld)
		}
		floor = []string{"--token-floor", fmt.Sprint(out.TokenFloor)}
	}
	// A second restore into a data dir that holds one is refused.
	code, _, stderr = ctlRun(t, old.Endpoints(), "snapshot", "restore", file, "--name", "n1",
		"--data-dir", restored.Nodes[0].DataDir, "--initial-cluster", restored.InitialCluster())
	if code != 1 || !strings.Contains(stderr, "not empty") {
		t.Fatalf("restore into a restored data dir: exit %d, %s", code, stderr)
	}
	old.Close() // the old cluster is gone; the new one must not need it
	for i := range restored.Nodes {
		restored.Start(i)
	}
	restored.waitLeader(15*time.Second, -1)

	nr := newRetrier(restored, 1)
	for res, want := range before {
		got, err := nr.get(res)
		if err != nil {
			t.Fatalf("get %s from the restored cluster: %v", res, err)
		}
		if got.GetHolder() != want.GetHolder() || got.GetToken() != want.GetToken() || string(got.GetValue()) != string(want.GetValue()) {
			t.Errorf("%s restored as holder %q token %d value %q, want %q %d %q", res, got.GetHolder(), got.GetToken(),
				got.GetValue(), want.GetHolder(), want.GetToken(), want.GetValue())
		}
	}
	for i := range 4 {
		res := fmt.Sprintf("backup/after%d", i)
		resp, _, err := nr.acquire(res, "new", "new-"+res, time.Minute)
		if err != nil {
			t.Fatalf("acquire %s on the restored cluster: %v", res, err)
		}
		if tok := resp.GetLease().GetToken(); tok <= maxOld {
			t.Fatalf("restored cluster granted %s token %d, not above %d, a token the old cluster granted after the backup", res, tok, maxOld)
		}
	}
}

// TestRestoredDataDirKeepsItsName: a restored data dir is refused under another member's name.
func TestRestoredDataDirKeepsItsName(t *testing.T) {
	c := newCluster(t, 1)
	file := filepath.Join(t.TempDir(), "leased.snap")
	if code, _, stderr := ctlRun(t, c.Endpoints(), "snapshot", "save", file); code != 0 {
		t.Fatalf("snapshot save exited %d: %s", code, stderr)
	}
	addrs := proc.FreeAddrs(t, 4)
	initial := "r1=" + addrs[0] + ",r2=" + addrs[1]
	dir := filepath.Join(t.TempDir(), "r1")
	if code, _, stderr := ctlRun(t, c.Endpoints(), "snapshot", "restore", file, "--name", "r1", "--data-dir", dir,
		"--initial-cluster", initial); code != 0 {
		t.Fatalf("restore exited %d: %s", code, stderr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, leasedBin, "--name=r2", "--data-dir="+dir, "--client-addr="+addrs[2],
		"--peer-addr="+addrs[1], "--admin-addr="+addrs[3], "--initial-cluster="+initial).CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(string(out), dir) {
		t.Fatalf("leased --name r2 on r1's restored data dir: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "raft.db")); err != nil {
		t.Fatal(err)
	}
}
