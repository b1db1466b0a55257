package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/leased/leased/client"
	"github.com/leased/leased/client/clienttest"
	"github.com/leased/leased/client/fence"
	"github.com/leased/leased/client/fence/memfence"
)

// stores is where holders write: a fenced memfence store and, side by side, a plain store that accepts
// every write (the "fence switched off" contrast). Both keep the log of writes they accepted, in commit
// order.
type stores struct {
	fenced *memfence.Store
	pg     *pgStore // nil without PostgreSQL

	pgRejected int

	mu        sync.Mutex
	fencedLog []write
	rejected  int
	plain     map[string]string
	plainLog  []write
}

func newStores(t testing.TB) *stores {
	return &stores{fenced: memfence.New(), pg: newPGStore(t), plain: map[string]string{}}
}

// write sends one write with token to both stores. It returns whether the fenced store accepted it.
func (s *stores) write(ctx context.Context, resource string, token uint64, value string) bool {
	err := s.fenced.Write(ctx, resource, token, func(tx *memfence.Tx) error {
		tx.Put(resource, []byte(value))
		s.mu.Lock() // inside the store's commit: the log order is the commit order
		s.fencedLog = append(s.fencedLog, write{resource, token, value})
		s.mu.Unlock()
		return nil
	})
	var pgErr error
	if s.pg != nil {
		pgErr = s.pg.write(ctx, resource, token, value)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if errors.Is(err, fence.ErrStaleToken) {
		s.rejected++
	}
	if errors.Is(pgErr, fence.ErrStaleToken) {
		s.pgRejected++
	}
	if ctx.Err() == nil {
		s.plain[resource] = value
		s.plainLog = append(s.plainLog, write{resource, token, value})
	}
	return err == nil
}

func (s *stores) finals() (fenced, plain map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fenced, plain = map[string]string{}, map[string]string{}
	for _, w := range s.fencedLog {
		if v, ok := s.fenced.Get(w.Resource); ok {
			fenced[w.Resource] = string(v)
		}
	}
	for k, v := range s.plain {
		plain[k] = v
	}
	return fenced, plain
}

// counters are the run's tallies for the summary.
type counters struct {
	mu     sync.Mutex
	ops    map[string]int // "acquire/ok", ...
	faults map[string]int
}

func (c *counters) op(kind opKind, out outcome) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ops[kind.String()+"/"+out.String()]++
}

// named counts an operation outside the porcupine model's kinds (the semaphore workload's).
func (c *counters) named(kind string, out outcome) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ops[kind+"/"+out.String()]++
}

// add counts n of something the run observed (kind/what).
func (c *counters) add(key string, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ops[key] += n
}

func (c *counters) fault(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.faults[name]++
}

// classify maps an SDK error to an outcome. Held and not-found are definite answers of the state
// machine; invalid / limit are refusals before anything was proposed; anything else (unavailable,
// deadline, cancelled) is unknown.
func classify(err error) outcome {
	switch {
	case err == nil:
		return outOK
	case errors.Is(err, client.ErrHeld):
		return outHeld
	case errors.Is(err, client.ErrNotFound):
		return outNotFound
	case errors.Is(err, client.ErrInvalid), errors.Is(err, client.ErrLimit):
		return outFailed
	}
	return outUnknown
}

// workload parameters.
const (
	leaseTTL       = 2 * time.Second
	acquireTimeout = 1500 * time.Millisecond // < leaseTTL: one Acquire call never spans an expiry of its own grant
	readTimeout    = time.Second
	durableTTL     = time.Minute
)

// newClient returns an SDK client for the run's cluster under holder name h.
func (r *run) newClient(h string, clk client.Clock) *client.Client {
	return r.newClientWith(h, clk, nil)
}

// newClientWith is newClient with the client's metrics on reg (nil: none).
func (r *run) newClientWith(h string, clk client.Clock, reg prometheus.Registerer) *client.Client {
	c, err := client.New(client.Config{
		Endpoints: r.c.Endpoints(), Holder: h, DialTimeout: time.Second, RequestTimeout: time.Second, Clock: clk,
		Logger:      r.clientLog.With("client", h),
		TLS:         r.c.tls.clientTLS(),
		DialOptions: []grpc.DialOption{r.cnet.dialOption(h)}, // through the client side of the fault layer
		Registerer:  reg,
	})
	if err != nil {
		panic(err) // only on a bad config
	}
	return c
}

func (r *run) resource(rng *rand.Rand) string {
	epoch := int(time.Since(r.hist.start) / r.cfg.Epoch)
	if rng.IntN(100) < 70 {
		return fmt.Sprintf("hot/%d/%d", epoch, rng.IntN(r.cfg.Hot))
	}
	return fmt.Sprintf("cold/%d/%d", epoch, rng.IntN(r.cfg.Cold))
}

// acquire runs one recorded Acquire; an unknown outcome is retried (as a new recorded operation) with the
// same request id, which is safe (decision 5), up to retries times.
func (r *run) acquire(ctx context.Context, cl *client.Client, id int, holder, res, reqID string, ttl time.Duration, retries int) (*client.Lease, outcome) {
	return r.acquireMaybeWaiting(ctx, cl, id, holder, res, reqID, ttl, retries, false)
}

// acquireMaybeWaiting is acquire, the first attempt queued (WithWait) if wait is set: it is then granted
// when the resource frees, usually by the entry of the release that frees it (a handoff). The wait has a
// deadline over a second away, so the SDK sends one waiting request whose wait the leader ends shortly
// before it (wait_ms): the leader's "held" at that end is its linearizable answer at that moment, and is
// checked as any refusal. A "held" that returns only once the deadline passed is recorded as unknown (a
// shorter wait's SDK reports an earlier answer's "held" then, while its grant may be in flight: a
// release carrying it, or its own entry, proposed just before) and retried without waiting under the
// same request id, which returns the grant if it was made.
func (r *run) acquireMaybeWaiting(ctx context.Context, cl *client.Client, id int, holder, res, reqID string, ttl time.Duration, retries int, wait bool) (*client.Lease, outcome) {
	for attempt := 0; ; attempt++ {
		in := opInput{Kind: opAcquire, Resource: res, Holder: holder, ReqID: reqID}
		opts := []client.AcquireOption{client.WithTTL(ttl), client.WithRequestID(reqID), client.WithHolder(holder)}
		waiting := wait && attempt == 0
		if waiting {
			opts = append(opts, client.WithWait())
		}
		call := r.hist.now()
		actx, cancel := context.WithTimeout(ctx, acquireTimeout)
		l, err := cl.Acquire(actx, res, opts...)
		ranOut := actx.Err() != nil
		cancel()
		ret := r.hist.now()
		r.checkOutcomeID(res, reqID, err)
		out := opOutput{Out: classify(err)}
		var he *client.HeldError
		switch {
		case waiting && ranOut && out.Out == outHeld:
			out.Out = outUnknown // no holder recorded: "held" is not the cluster's word on this instant
		case err == nil:
			out.Holder, out.Token = l.Holder(), l.Token()
		case errors.As(err, &he):
			out.Holder, out.Token = he.Holder, he.Token
		}
		r.hist.add(op{Client: id, In: in, Out: out, Call: call, Return: ret, Attempt: attempt})
		r.stats.op(opAcquire, out.Out)
		if waiting {
			// Among the acquires above: how the waits ended (held: the leader's answer at the wait's end).
			r.stats.named("acquire-waiting", out.Out)
		}
		if out.Out != outUnknown || attempt >= retries || ctx.Err() != nil {
			return l, out.Out
		}
	}
}

// checkOutcomeID records a finding when an Acquire's unknown outcome does not name the request id its
// attempts carried (client.OutcomeRequestID), the id a caller needs to claim or release the grant.
func (r *run) checkOutcomeID(res, reqID string, err error) {
	if !errors.Is(err, client.ErrOutcomeUnknown) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.outcomeChecked++
	if got, ok := client.OutcomeRequestID(err); !ok || got != reqID {
		r.outcomeFindings = append(r.outcomeFindings, fmt.Sprintf("acquire %s with request id %q: outcome unknown naming %q (named: %v): %v", res, reqID, got, ok, err))
	}
}

func (r *run) release(ctx context.Context, id int, res string, token uint64, do func(ctx context.Context) error) outcome {
	r.sentRelease(res, token)
	call := r.hist.now()
	rctx, cancel := context.WithTimeout(ctx, readTimeout)
	err := do(rctx)
	cancel()
	out := classify(err)
	r.hist.add(op{Client: id, In: opInput{Kind: opRelease, Resource: res, Token: token}, Out: opOutput{Out: out}, Call: call, Return: r.hist.now()})
	r.stats.op(opRelease, out)
	return out
}

func (r *run) sentRelease(res string, token uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := releaseKey{res, token}
	if _, ok := r.releases[k]; !ok {
		r.releases[k] = time.Now()
	}
}

func (r *run) get(ctx context.Context, cl *client.Client, id int, res string) {
	call := r.hist.now()
	gctx, cancel := context.WithTimeout(ctx, readTimeout)
	info, err := cl.Get(gctx, res)
	cancel()
	out := opOutput{Out: classify(err)}
	if err == nil {
		out.Holder, out.Token = info.Holder, info.Token
	}
	r.hist.add(op{Client: id, In: opInput{Kind: opGet, Resource: res}, Out: out, Call: call, Return: r.hist.now()})
	r.stats.op(opGet, out.Out)
}

// watchDone records when a lease's Done closed (as seen by this goroutine).
func (r *run) watchDone(l *client.Lease, b *belief) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		<-l.Done()
		seen := time.Now()
		r.mu.Lock()
		b.DoneSeen, b.EndReason = seen, endReason(l.Err())
		r.mu.Unlock()
	}()
}

func (r *run) addBelief(b *belief) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.beliefs = append(r.beliefs, b)
}

// worker is one client process of the workload: acquire / hold and write through the fence / release or
// abandon, get, and release with a stale token, on hot and cold resources. Every choice comes from rng.
func (r *run) worker(ctx context.Context, id int) {
	defer r.wg.Done()
	rng := rand.New(rand.NewPCG(r.cfg.Seed, uint64(id)+1))
	holder := fmt.Sprintf("w%d", id)
	rates := []float64{1, 1, 0.996, 1.004} // clock-rate skew within the SDK's 1% drift bound
	clk := clienttest.NewSkewedClock(rates[rng.IntN(len(rates))])
	cl := r.newClient(holder, clk)
	defer func() { _ = cl.Close() }()
	old := map[string][]uint64{} // tokens this worker held, per resource
	for n := 0; n < r.cfg.OpsPerWorker && ctx.Err() == nil; n++ {
		res := r.resource(rng)
		switch x := rng.IntN(100); {
		case x < 55:
			reqID := fmt.Sprintf("%s-%d", holder, n)
			// One acquire in four queues for the resource, so that releases hand resources over.
			l, _ := r.acquireMaybeWaiting(ctx, cl, id, holder, res, reqID, leaseTTL, 1, rng.IntN(4) == 0)
			if l == nil {
				continue
			}
			old[res] = append(old[res], l.Token())
			if r.hold(ctx, rng, l) {
				do := l.Release
				if r.cfg.Plants.has(plantReleaseRetry) {
					do = func(ctx context.Context) error {
						// planted: the first answer is dropped as if lost, and the retry's answer (OK:
						// already released) reported as NOT_FOUND, as the SDK did before Release was
						// idempotent
						_ = l.Release(ctx)
						if err := cl.Release(ctx, l.Resource(), l.Token()); err != nil {
							return err
						}
						return fmt.Errorf("planted: %w", client.ErrNotFound)
					}
				}
				r.release(ctx, id, res, l.Token(), do)
			} else {
				// abandon: the process "crashes" (its client goes away); the lease must expire on its own
				_ = cl.Close()
				cl = r.newClient(holder, clk)
			}
		case x < 88:
			r.get(ctx, cl, id, res)
		default:
			if toks := old[res]; len(toks) > 0 {
				tok := toks[rng.IntN(len(toks))]
				r.release(ctx, id, res, tok, func(ctx context.Context) error { return cl.Release(ctx, res, tok) })
			}
		}
	}
}

// hold keeps l for a while, checking it and writing through the fence every few tens of milliseconds. It
// reports whether to release (true) or abandon (false) the lease afterwards.
func (r *run) hold(ctx context.Context, rng *rand.Rand, l *client.Lease) bool {
	until := time.Now().Add(time.Duration(100+rng.IntN(700)) * time.Millisecond)
	r.writeWhileHeld(ctx, rng, l, func() bool { return time.Now().Before(until) })
	return rng.IntN(100) < 80
}

// writeWhileHeld records the belief that l is held and, while holding says so and the lease is valid,
// checks it and writes through the fence every few tens of milliseconds.
func (r *run) writeWhileHeld(ctx context.Context, rng *rand.Rand, l *client.Lease, holding func() bool) {
	b := &belief{Resource: l.Resource(), Token: l.Token(), Holder: l.Holder(), Acquired: time.Now()}
	r.addBelief(b)
	r.watchDone(l, b)
	for seq := 0; holding() && ctx.Err() == nil; seq++ {
		tb := time.Now()
		if l.Err() != nil || l.Remaining() <= 0 {
			break
		}
		r.mu.Lock()
		b.LastValid = tb
		r.mu.Unlock()
		_ = l.Fenced(ctx, func(ctx context.Context, token uint64) error {
			r.stores.write(ctx, l.Resource(), token, fmt.Sprintf("%s/%d/%d", l.Holder(), token, seq))
			return nil
		})
		sleepCtx(ctx, time.Duration(20+rng.IntN(60))*time.Millisecond) // the holder's own pace
	}
}

// sleepCtx sleeps d or until ctx ends (a pause of the schedule, never a wait for a condition).
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// pausedHolder is the client-pause nemesis: a holder acquires a hot resource, writes, then freezes (its
// keep-alive stops: the client is gone) for longer than the TTL, wakes and writes again with its old token,
// as a process after a long GC pause would. The fenced store must reject that write when someone else
// wrote with a newer token meanwhile; the plain store takes it.
func (r *run) pausedHolder(ctx context.Context, rng *rand.Rand, n int) {
	holder := fmt.Sprintf("pauser%d", n)
	cl := r.newClient(holder, nil)
	res := fmt.Sprintf("hot/%d/%d", int(time.Since(r.hist.start)/r.cfg.Epoch), rng.IntN(r.cfg.Hot))
	var l *client.Lease
	for try := 0; l == nil && try < 30 && ctx.Err() == nil; try++ { // hot resources are usually held
		l, _ = r.acquire(ctx, cl, 1000+n, holder, res, fmt.Sprintf("%s-%d", holder, try), leaseTTL, 2)
		if l == nil {
			sleepCtx(ctx, 50*time.Millisecond)
		}
	}
	if l == nil {
		_ = cl.Close()
		return
	}
	b := &belief{Resource: res, Token: l.Token(), Holder: holder, Acquired: time.Now()}
	r.addBelief(b)
	r.watchDone(l, b)
	tb := time.Now()
	if l.Err() == nil && l.Remaining() > 0 {
		r.mu.Lock()
		b.LastValid = tb
		r.mu.Unlock()
		r.stores.write(ctx, res, l.Token(), fmt.Sprintf("%s/%d/before", holder, l.Token()))
	}
	_ = cl.Close() // frozen: no more renewals
	sleepCtx(ctx, 2*leaseTTL+time.Duration(rng.IntN(1000))*time.Millisecond)
	if ctx.Err() != nil {
		return
	}
	if !r.stores.write(ctx, res, l.Token(), fmt.Sprintf("%s/%d/after-pause", holder, l.Token())) {
		r.stats.fault("holder-pause-stale-write-rejected")
	}
}

// durableWorker keeps long-TTL leases (I3): it acquires durable/<k>/<n> and releases some of them, and
// remembers which grants and releases were acknowledged.
func (r *run) durableWorker(ctx context.Context, k int) {
	defer r.wg.Done()
	rng := rand.New(rand.NewPCG(r.cfg.Seed, 10000+uint64(k)))
	holder := fmt.Sprintf("d%d", k)
	cl := r.newClient(holder, nil)
	r.mu.Lock()
	r.durableClients = append(r.durableClients, cl)
	r.mu.Unlock()
	var held []*client.Lease
	for n := 0; n < r.cfg.OpsPerWorker && ctx.Err() == nil; n++ {
		if len(held) < 8 || rng.IntN(100) < 40 {
			res := fmt.Sprintf("durable/%d/%d", k, n)
			if l, _ := r.acquire(ctx, cl, 2000+k, holder, res, fmt.Sprintf("%s-%d", holder, n), durableTTL, 3); l != nil {
				held = append(held, l)
			}
		} else {
			i := rng.IntN(len(held))
			l := held[i]
			held = append(held[:i], held[i+1:]...)
			out := r.release(ctx, 2000+k, l.Resource(), l.Token(), l.Release)
			r.mu.Lock()
			r.durable = append(r.durable, durableRecord{Resource: l.Resource(), Token: l.Token(), Released: out == outOK, Unsure: out != outOK})
			r.mu.Unlock()
		}
		sleepCtx(ctx, time.Duration(100+rng.IntN(300))*time.Millisecond)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.durableHeld = append(r.durableHeld, held...)
}
