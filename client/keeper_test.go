package client_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/leased/leased/client"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest"
)

// TestKeeperSplitsRenewalsUnderTheServerLimit: a client holding more leases than one KeepAlive message may
// carry renews them in several messages and keeps them all.
func TestKeeperSplitsRenewalsUnderTheServerLimit(t *testing.T) {
	cl := servertest.Start(t, 3, func(cfg *server.Config) { cfg.Limits.MaxKeepAliveLeases = 10 })
	c := newClient(t, cl.Endpoints(), func(cfg *client.Config) { cfg.KeepAliveBatch = 4 })
	ctx := ctxT(t)
	var leases []*client.Lease
	for i := range 25 { // 25 leases: 7 messages of at most 4
		l, err := c.Acquire(ctx, fmt.Sprintf("many/%d", i), client.WithTTL(400*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	end := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(end) {
		for _, l := range leases {
			if l.Err() != nil {
				t.Fatalf("%s lost: %v", l.Resource(), l.Err())
			}
		}
		time.Sleep(50 * time.Millisecond) // observation interval
	}
}
