package server_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server"
)

// faultCluster is a three-node cluster whose every raft log sits behind a StorageFault.
type faultCluster struct {
	nodes  []*server.Server
	faults []*server.StorageFault
}

func startFaultCluster(t *testing.T) *faultCluster {
	skipShort(t)
	t.Helper()
	const size = 3
	cfgs, lis := make([]server.Config, size), make([]server.Listeners, size)
	peers := map[string]string{}
	for i := range size {
		lis[i] = server.Listeners{Client: listenLocal(t), Peer: listenLocal(t)}
		cfgs[i] = server.TestConfig()
		cfgs[i].Name, cfgs[i].DataDir = fmt.Sprintf("n%d", i+1), filepath.Join(t.TempDir(), fmt.Sprintf("n%d", i+1))
		cfgs[i].ClientAddr, cfgs[i].PeerAddr = lis[i].Client.Addr().String(), lis[i].Peer.Addr().String()
		peers[cfgs[i].Name] = cfgs[i].PeerAddr
	}
	c := &faultCluster{}
	for i := range size {
		cfgs[i].InitialCluster = peers
		s, f, err := server.NewWithStorageFault(cfgs[i], lis[i])
		if err != nil {
			t.Fatal(err)
		}
		c.nodes, c.faults = append(c.nodes, s), append(c.faults, f)
	}
	for _, s := range c.nodes {
		s.Start()
		t.Cleanup(func() { _ = s.Close() })
	}
	return c
}

// leader is the index of a running node that leads, or -1.
func (c *faultCluster) leader() int {
	for i, s := range c.nodes {
		select {
		case <-s.Done():
			continue
		default:
		}
		if s.IsLeader() {
			return i
		}
	}
	return -1
}

// acquire grants resource through whichever running node leads, retrying until it is acknowledged.
func (c *faultCluster) acquire(t *testing.T, resource string) *leasepb.Lease {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		if l := c.leader(); l >= 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			resp, err := dial(t, c.nodes[l].ClientAddr()).Acquire(ctx, &leasepb.AcquireRequest{Resource: resource, Holder: "h", TtlMs: 60_000})
			cancel()
			if err == nil {
				return resp.GetLease()
			}
			if code(err).String() == "FailedPrecondition" { // held: an earlier attempt's grant applied
				return nil
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("acquire %s: no leader acknowledged it within 15s", resource)
		}
		time.Sleep(20 * time.Millisecond) // an election is under way
	}
}

// TestDiskErrorStopsTheNodeAndTheMajorityGoesOn (decision 13): when a raft log write fails with EIO or
// ENOSPC, on the leader or on a follower, that node stops with the error, the other two elect a leader
// (or keep theirs) and serve, and every grant acknowledged before, during and after is there.
func TestDiskErrorStopsTheNodeAndTheMajorityGoesOn(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.EIO, syscall.ENOSPC} {
		for _, role := range []string{"leader", "follower"} {
			t.Run(fmt.Sprintf("%s on the %s", errno, role), func(t *testing.T) {
				c := startFaultCluster(t)
				eventually(t, 10*time.Second, "a leader", func() bool { return c.leader() >= 0 })
				acked := map[string]uint64{}
				grant := func(r string) {
					if l := c.acquire(t, r); l != nil {
						acked[r] = l.GetToken()
					}
				}
				for i := range 10 {
					grant(fmt.Sprintf("before/%d", i))
				}
				victim := c.leader()
				if role == "follower" {
					victim = (victim + 1) % len(c.nodes)
				}
				c.faults[victim].Fail(errno)
				for i := 0; ; i++ {
					grant(fmt.Sprintf("during/%d", i))
					select {
					case <-c.nodes[victim].Done():
					default:
						if i > 200 {
							t.Fatalf("n%d kept running after its raft log write failed with %v", victim+1, errno)
						}
						continue
					}
					break
				}
				if err := c.nodes[victim].Err(); !errors.Is(err, errno) {
					t.Fatalf("n%d stopped with %v, want %v", victim+1, err, errno)
				}
				for i := range 10 {
					grant(fmt.Sprintf("after/%d", i))
				}
				l := c.leader()
				if l < 0 || l == victim {
					t.Fatalf("leader after the fault: n%d", l+1)
				}
				cl := dial(t, c.nodes[l].ClientAddr())
				for r, token := range acked {
					got, err := cl.Get(ctxT(t), &leasepb.GetRequest{Resource: r})
					if err != nil || got.GetLease().GetToken() != token {
						t.Errorf("acknowledged %s (token %d) after the fault: %v, %v", r, token, got, err)
					}
				}
			})
		}
	}
}
