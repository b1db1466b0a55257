package server_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leased/leased/api/leasepb"
)

// BenchmarkContendedHandoff measures handoffs of one resource between 16 clients of the raw API on an
// in-process 3-node cluster: each client loops Acquire with wait, then Release, so the resource passes
// from holder to holder through the leader's FIFO queue. A handoff is one grant answered; handoffs/s is the
// rate at which the resource changes hands (every grant but the first follows a release);
// %-in-release-entry is the share of grants made by the very entry of the release before them (a token
// equal to that release's index), the rest by an entry of their own.
// Run: go test -run '^$' -bench ContendedHandoff -benchtime 2000x -count 3 ./server/
func BenchmarkContendedHandoff(b *testing.B) {
	const clients, resource = 16, "contended"
	c := newBenchCluster(b)
	cl := c.Leases(c.WaitLeader())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute) // bounds the loop
	defer cancel()
	var (
		next, granted atomic.Int64
		wg            sync.WaitGroup
		mu            sync.Mutex
		lastToken     uint64
		tokens        []uint64            // every grant
		releasedAt    = map[uint64]bool{} // the index of every release entry
	)
	b.ResetTimer()
	for w := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
				resp, err := cl.Acquire(ctx, &leasepb.AcquireRequest{
					Resource: resource, Holder: fmt.Sprintf("h%d", w), TtlMs: 60_000, Wait: true, RequestId: fmt.Sprint(i),
				})
				if err != nil {
					b.Error(err)
					return
				}
				tok := resp.GetLease().GetToken()
				mu.Lock()
				if tok <= lastToken {
					b.Errorf("token %d granted after %d", tok, lastToken)
				}
				lastToken = tok
				tokens = append(tokens, tok)
				mu.Unlock()
				granted.Add(1)
				rel, err := cl.Release(ctx, &leasepb.ReleaseRequest{Resource: resource, Token: tok})
				if err != nil {
					b.Error(err)
					return
				}
				mu.Lock()
				releasedAt[rel.GetReleasedIndex()] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(granted.Load())/b.Elapsed().Seconds(), "handoffs/s")
	inRelease := 0
	for _, tok := range tokens {
		if releasedAt[tok] {
			inRelease++
		}
	}
	b.ReportMetric(100*float64(inRelease)/float64(max(len(tokens), 1)), "%-in-release-entry")
}
