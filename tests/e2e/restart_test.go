package e2e

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestFullClusterRestart stops every node cleanly (SIGTERM: exit code 0), starts them again on their data
// dirs, and checks that every acknowledged lease survived (invariant I3) and that new tokens stay larger
// than every earlier one (I1 across restarts).
func TestFullClusterRestart(t *testing.T) {
	c := newCluster(t, 3)
	r := newRetrier(c, 0)
	const n = 6
	tokens := map[string]uint64{}
	var maxToken uint64
	for i := range n {
		res := fmt.Sprintf("restart/r%d", i)
		resp, _, err := r.acquire(res, "holder-a", fmt.Sprintf("req-%d", i), 10*time.Minute)
		if err != nil {
			t.Fatalf("acquire %s: %v", res, err)
		}
		tokens[res] = resp.GetLease().GetToken()
		maxToken = max(maxToken, tokens[res])
	}

	var wg sync.WaitGroup
	codes := make([]int, len(c.Nodes))
	for i := range c.Nodes {
		wg.Go(func() { codes[i] = c.stop(i) })
	}
	wg.Wait()
	for i, code := range codes {
		if code != 0 {
			t.Errorf("%s exited with %d after SIGTERM, want 0", c.Nodes[i].Name, code)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	for i := range c.Nodes {
		c.Start(i)
	}
	c.waitLeader(10*time.Second, -1)
	c.eventually(10*time.Second, "every node ready", func() bool {
		for i := range c.Nodes {
			if c.readyz(i) != http.StatusOK {
				return false
			}
		}
		return true
	})
	for res, token := range tokens {
		lease, err := r.get(res)
		if err != nil {
			t.Errorf("get %s after restart: %v", res, err)
			continue
		}
		if lease.GetToken() != token || lease.GetHolder() != "holder-a" {
			t.Errorf("%s after restart: holder %q token %d, want holder-a token %d", res, lease.GetHolder(), lease.GetToken(), token)
		}
	}
	resp, _, err := r.acquire("restart/new", "holder-b", "req-new", time.Minute)
	if err != nil {
		t.Fatalf("acquire after restart: %v", err)
	}
	if tok := resp.GetLease().GetToken(); tok <= maxToken {
		t.Errorf("token %d granted after the restart, want more than %d", tok, maxToken)
	}
}
