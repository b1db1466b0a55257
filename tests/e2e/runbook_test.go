package e2e

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leased/leased/tests/internal/proc"
)

// runbookCommands returns the shell commands of the section called heading in docs/operations.md: every
// line of its ```sh blocks, continuation lines joined, split into words.
func runbookCommands(t *testing.T, heading string) [][]string {
	t.Helper()
	b, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start := strings.Index(doc, "\n"+heading+"\n")
	if start < 0 {
		t.Fatalf("docs/operations.md has no section %q", heading)
	}
	section := doc[start+len(heading)+2:]
	if end := strings.Index(section, "\n### "); end >= 0 {
		section = section[:end]
	}
	var cmds [][]string
	var cur string
	inBlock := false
	sc := bufio.NewScanner(strings.NewReader(section))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "```sh":
			inBlock = true
		case line == "```":
			inBlock = false
		case inBlock:
			cur += " " + strings.TrimSuffix(line, "\\")
			if !strings.HasSuffix(line, "\\") {
				cmds = append(cmds, strings.Fields(cur))
				cur = ""
			}
		}
	}
	return cmds
}

// TestReplaceRunbook runs docs/operations.md's "Replace a failed node" as written: n2 dies; remove it,
// add n4, start n4 with the documented command line, and n4 ends up a voter. The documentation's
// addresses 10.0.1.K stand for node nK's, /var/lib/leased for n4's data dir, and /etc/leased/gossip.key
// for the cluster's gossip key.
func TestReplaceRunbook(t *testing.T) {
	cmds := runbookCommands(t, "### Replace a failed node")
	if len(cmds) != 4 || cmds[2][0] != "leased" {
		t.Fatalf("the runbook's commands changed shape (want leasectl, leasectl, leased, leasectl): %q", cmds)
	}
	key := filepath.Join(t.TempDir(), "gossip.key")
	if err := os.WriteFile(key, []byte("MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := newClusterWith(t, proc.Config{Size: 3, Gossip: true, Args: []string{"--gossip-key-file=" + key}})
	c.Kill(1)
	c.waitLeader(10*time.Second, 1)
	n4 := c.Nodes[c.AddNode("n4")]
	var pairs []string
	for k, n := range c.Nodes {
		host := fmt.Sprintf("10.0.1.%d:", k+1)
		if n.Name == "n4" {
			host = "10.0.1.4:"
		}
		pairs = append(pairs, host+"7101", n.ClientAddr, host+"7201", n.PeerAddr, host+"7301", n.GossipAddr)
	}
	pairs = append(pairs, "/var/lib/leased", n4.DataDir, "/etc/leased/gossip.key", key)
	subst := strings.NewReplacer(pairs...)
	for _, cmd := range cmds {
		args := make([]string, len(cmd)-1)
		for i, a := range cmd[1:] {
			args[i] = subst.Replace(a)
		}
		switch cmd[0] {
		case "leasectl":
			ctlOK(t, c.running(), args...)
		case "leased":
			startRunbookNode(t, n4.LogPath, args)
		default:
			t.Fatalf("the runbook runs %q", cmd[0])
		}
		if cmd[0] == "leased" {
			c.eventually(promoteWithin, "n4 a voter", func() bool {
				m, ok := memberList(t, c.running())["n4"]
				return ok && !m.IsLearner && m.ClientAddr == n4.ClientAddr
			})
		}
	}
	rows := memberList(t, c.running())
	if len(rows) != 3 || rows["n2"].Name != "" || rows["n4"].IsLearner {
		t.Fatalf("members after the runbook: %v", rows)
	}
}

// startRunbookNode runs leased with args (and the tests' fast timing) until the test ends.
func startRunbookNode(t *testing.T, logPath string, args []string) {
	t.Helper()
	args = append(args, "--election-timeout="+proc.ElectionTimeout.String(), "--admin-addr=")
	select {
	case <-runLeased(t, logPath, args):
		t.Fatalf("leased %s exited at once:\n%s", strings.Join(args, " "), tail(logPath, 10))
	case <-time.After(2 * time.Second):
	}
}
