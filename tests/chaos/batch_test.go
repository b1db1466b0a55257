package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leased/leased/client"
)

// The batched workload. The SDK sends the quick writes that goroutines of one client make at the same
// moment as one request on its Writes stream (client/batch.go, client/writestream.go); the run's other
// workers each own a client and make one call at a time, so they never form a batch. Here a group of
// batchGroupSize workers shares one client, and each round they acquire at the same instant, hold their
// leases (writing through the fence), and release at the same instant: the SDK batches their acquires and
// their releases, under the run's faults. Their operations go into the same history as every other
// worker's, and the same checkers hold them to the same promises (linearizable, I1, I2, I5, nothing
// acknowledged lost); members of a round often pick the same hot resource, so one batch carries grants and
// refusals of one resource. A batch lost in transit leaves each of its writes unknown, which the harness
// retries with the same request id, as any other.

// batchGroupSize is how many workers share a batched client.
const batchGroupSize = 6

// batchGroup runs batched group g until the run ends, and counts the Writes requests (or Batch calls) its
// client made ("batch-call/<code>").
func (r *run) batchGroup(ctx context.Context, g int) {
	defer r.wg.Done()
	rng := rand.New(rand.NewPCG(r.cfg.Seed, 30000+uint64(g)))
	reg := prometheus.NewRegistry()
	cl := r.newClientWith(fmt.Sprintf("batch%d", g), nil, reg)
	defer func() {
		_ = cl.Close()
		r.countBatchCalls(reg)
	}()
	for round := 0; round < r.cfg.OpsPerWorker && ctx.Err() == nil; round++ {
		r.batchRound(ctx, rng, cl, g, round)
		sleepCtx(ctx, time.Duration(20+rng.IntN(200))*time.Millisecond)
	}
}

// batchRound is one round of group g: every member acquires at once, holds, and releases at once.
func (r *run) batchRound(ctx context.Context, rng *rand.Rand, cl *client.Client, g, round int) {
	start, release := make(chan struct{}), make(chan struct{})
	var acquired, done sync.WaitGroup
	acquired.Add(batchGroupSize)
	for k := range batchGroupSize {
		id := 4000 + g*batchGroupSize + k
		holder := fmt.Sprintf("batch%d-%d", g, k)
		res, reqID := r.resource(rng), fmt.Sprintf("%s-%d", holder, round)
		mrng := rand.New(rand.NewPCG(rng.Uint64(), uint64(id)))
		done.Go(func() {
			<-start
			l, _ := r.acquire(ctx, cl, id, holder, res, reqID, leaseTTL, 1)
			acquired.Done()
			if l == nil {
				return
			}
			r.writeWhileHeld(ctx, mrng, l, func() bool {
				select {
				case <-release:
					return false
				default:
					return true
				}
			})
			<-release
			r.release(ctx, id, res, l.Token(), l.Release)
		})
	}
	close(start)
	acquired.Wait()
	sleepCtx(ctx, time.Duration(100+rng.IntN(500))*time.Millisecond)
	close(release)
	done.Wait()
}

// countBatchCalls adds the Batch calls a client made, by gRPC code, to the run's counts.
func (r *run) countBatchCalls(reg *prometheus.Registry) {
	families, err := reg.Gather()
	if err != nil {
		return
	}
	for _, f := range families {
		if f.GetName() != "leased_client_requests_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			var method, code string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "method":
					method = l.GetValue()
				case "code":
					code = l.GetValue()
				}
			}
			// Their writes travel as requests on the Writes stream.
			if method == "Writes" && m.GetCounter().GetValue() > 0 {
				r.stats.add("batch-call/"+code, int(m.GetCounter().GetValue()))
			}
		}
	}
}
