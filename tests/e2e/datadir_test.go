package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leased/leased/tests/internal/proc"
)

// TestForeignDataDirRefused starts leased on a data dir that belongs to another node: it must exit 1 with
// a message that names the data dir. (A different --initial-cluster on an existing data dir is not
// refused but ignored: the member table in the data dir is the authority, TestRestartKeepsTheMemberTable.)
func TestForeignDataDirRefused(t *testing.T) {
	c := newCluster(t, 1)
	if code := c.stop(0); code != 0 {
		t.Fatalf("clean stop exited %d", code)
	}
	p := c.Nodes[0]
	other := proc.FreeAddrs(t, 3)
	for _, tc := range []struct{ name, node, initial string }{
		{"another node", "n9", "n9=" + p.PeerAddr},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, leasedBin, "--name="+tc.node, "--data-dir="+p.DataDir,
				"--client-addr="+other[1], "--peer-addr="+p.PeerAddr, "--admin-addr="+other[2],
				"--initial-cluster="+tc.initial)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 1 {
				t.Fatalf("got %v, want exit code 1; output:\n%s", err, out)
			}
			if !strings.Contains(string(out), p.DataDir) {
				t.Errorf("message does not name the data dir %s:\n%s", p.DataDir, out)
			}
			t.Logf("refused: %s", strings.TrimSpace(string(out)))
		})
	}
}

// TestCorruptedDataFileRefused damages a stopped node's raft.db in several ways; leased must refuse to
// start (exit 1) with a message naming the file, and never start empty over it. (Damage inside the pages,
// page by page, is raftlog's fuzz test's job.)
func TestCorruptedDataFileRefused(t *testing.T) {
	c := newCluster(t, 1)
	if code := c.stop(0); code != 0 {
		t.Fatalf("clean stop exited %d", code)
	}
	p := c.Nodes[0]
	file := filepath.Join(p.DataDir, "raft.db")
	good, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	// Flip bytes in both bbolt meta pages (the first two 4 KiB pages): every open must read them. (Bytes
	// flipped at random elsewhere may land in free pages, which is no damage at all.)
	flipped := bytes.Clone(good)
	for _, page := range []int{0, 4096} {
		for i := page + 16; i < page+80; i++ {
			flipped[i] ^= 0xff
		}
	}
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"truncated", good[:len(good)/3]},
		{"garbage", bytes.Repeat([]byte("not a bbolt file "), 1000)},
		{"empty", nil},
		{"flipped meta pages", flipped},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.WriteFile(file, tc.data, 0o600); err != nil {
				t.Fatal(err)
			}
			expectRefused(t, p, file)
		})
	}
	// The WAL beside raft.db: a damaged segment header (every segment's first record) is refused too,
	// naming the segment, and so is a byte flipped in the newest segment's last record, which is no torn
	// write (nothing but zeros follows it, but no part of it is missing). raftlog's own tests cover every
	// byte, and what a torn write looks like.
	t.Run("damaged WAL segment", func(t *testing.T) {
		if err := os.WriteFile(file, good, 0o600); err != nil {
			t.Fatal(err)
		}
		segs, err := filepath.Glob(filepath.Join(p.DataDir, "wal", "*.wal"))
		if err != nil || len(segs) == 0 {
			t.Fatalf("no WAL segments in %s (%v)", p.DataDir, err)
		}
		seg := segs[len(segs)-1] // names sort by sequence number
		data, err := os.ReadFile(seg)
		if err != nil {
			t.Fatal(err)
		}
		data[12] ^= 0xff
		if err := os.WriteFile(seg, data, 0o600); err != nil {
			t.Fatal(err)
		}
		expectRefused(t, p, seg)
		data[12] ^= 0xff
		end := len(bytes.TrimRight(data, "\x00")) // where the records end
		data[end-3] ^= 0x10
		if err := os.WriteFile(seg, data, 0o600); err != nil {
			t.Fatal(err)
		}
		expectRefused(t, p, seg)
	})
}

// TestLostWritesRefused cuts a node's newest WAL segment short, as a disk that lost writes it had
// acknowledged leaves it: the node must refuse to start (exit 1) naming the ack file (whose mark the log
// falls short of) and the runbook, instead of starting with a shorter log that could vote. Cut by half
// after a clean stop and after a SIGKILL: every append the node acknowledged is covered, not only those
// before its last vote or clean stop.
func TestLostWritesRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		stop func(c *cluster) int
	}{
		{"clean stop", func(c *cluster) int { return c.stop(0) }},
		{"SIGKILL", func(c *cluster) int { return c.Stop(0, syscall.SIGKILL, 15*time.Second) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, 1)
			r := newRetrier(c, 0)
			for i := range 20 {
				if _, _, err := r.acquire(fmt.Sprintf("lost/r%d", i), "holder", fmt.Sprintf("req-%d", i), time.Minute); err != nil {
					t.Fatal(err)
				}
			}
			tc.stop(c)
			p := c.Nodes[0]
			segs, err := filepath.Glob(filepath.Join(p.DataDir, "wal", "*.wal"))
			if err != nil || len(segs) == 0 {
				t.Fatalf("no WAL segments in %s (%v)", p.DataDir, err)
			}
			seg := segs[len(segs)-1]
			data, err := os.ReadFile(seg)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(seg, int64(len(bytes.TrimRight(data, "\x00"))/2)); err != nil {
				t.Fatal(err)
			}
			out := expectRefused(t, p, filepath.Join(p.DataDir, "acked"))
			if !strings.Contains(out, "shorter than this node acknowledged") {
				t.Errorf("the message does not say the log is shorter than acknowledged:\n%s", out)
			}
		})
	}
}

// expectRefused starts leased on p's data dir and expects exit code 1 with a message naming file and the
// runbook, which it returns.
func expectRefused(t *testing.T, p *proc.Node, file string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	other := proc.FreeAddrs(t, 2)
	cmd := exec.CommandContext(ctx, leasedBin, "--name="+p.Name, "--data-dir="+p.DataDir,
		"--client-addr="+other[0], "--peer-addr="+p.PeerAddr, "--admin-addr="+other[1],
		"--initial-cluster="+p.Name+"="+p.PeerAddr)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("got %v, want exit code 1; output:\n%s", err, out)
	}
	if !strings.Contains(string(out), file) {
		t.Errorf("message does not name %s:\n%s", file, out)
	}
	if !strings.Contains(string(out), `docs/operations.md, "A damaged or short data dir"`) {
		t.Errorf("message does not name the runbook:\n%s", out)
	}
	t.Logf("refused: %s", bytes.TrimSpace(out))
	return string(out)
}
