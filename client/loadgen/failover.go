package loadgen

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// The failover load measures outages passively: one worker acquires continuously, and every gap longer
// than Failover.Gap between two consecutive successful acquires is an outage. Whoever runs it stops, kills
// or partitions the leader meanwhile (a tool pointed at a real cluster cannot do that itself).

// Failover configures Pool.Failover.
type Failover struct {
	// Gap is the longest stretch between two consecutive successful acquires that is not an outage
	// (more than 0).
	Gap time.Duration
	// OnServing, OnDown and OnUp, when set, tell the run's progress as it goes: the first success; an
	// outage under way, once no success has come for Gap since the last one (told once per outage, with
	// its Length so far); an outage's end (always after its OnDown). They are called one at a time and
	// must return quickly, without calling the Outages that calls them.
	OnServing func()
	OnDown    func(Outage)
	OnUp      func(Outage)
}

// Validate says what is wrong with f, if anything.
func (f Failover) Validate() error {
	if f.Gap <= 0 {
		return fmt.Errorf("gap must be more than 0, not %v", f.Gap)
	}
	return nil
}

// Outage is a stretch of a failover run without a successful operation for longer than its gap.
type Outage struct {
	// Start is when the last success before it happened, since the run began; At is that instant on
	// the wall clock.
	Start time.Duration
	At    time.Time
	// Length runs from Start to the next success, or to the run's end when Ended is false.
	Length time.Duration
	Ended  bool
	// Errors counts the operations that failed during it; FirstErr is the first of them (nil if none did).
	Errors   int
	FirstErr error
}

// Outages finds a run's outages in the times its operations succeed and fail, read from its clock when
// they are reported. It is safe for concurrent use. Pool.Failover feeds one; tests can feed their own.
type Outages struct {
	f     Failover
	now   func() time.Time
	begin time.Time

	mu    sync.Mutex
	last  time.Time // the last success; zero before the first
	down  bool      // OnDown was told about the stretch since last
	errs  int       // failures since last
	first error     // the first of them
	found []Outage
}

// NewOutages starts looking for outages longer than f.Gap, from now() on.
func NewOutages(f Failover, now func() time.Time) *Outages {
	return &Outages{f: f, now: now, begin: now()}
}

// Succeeded records a success.
func (o *Outages) Succeeded() {
	o.mu.Lock()
	defer o.mu.Unlock()
	t := o.now()
	switch {
	case o.last.IsZero():
		if o.f.OnServing != nil {
			o.f.OnServing()
		}
	case t.Sub(o.last) > o.f.Gap:
		o.checkLocked(t) // OnDown first, even if no Check saw the stretch
		out := o.outageLocked(t, true)
		o.found = append(o.found, out)
		if o.f.OnUp != nil {
			o.f.OnUp(out)
		}
	}
	o.last, o.down, o.errs, o.first = t, false, 0, nil
}

// Failed records a failure. Failures before the first success belong to no outage.
func (o *Outages) Failed(err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.last.IsZero() {
		return
	}
	if o.errs++; o.first == nil {
		o.first = err
	}
	o.checkLocked(o.now())
}

// Check tells OnDown when the stretch since the last success has just grown past the gap.
func (o *Outages) Check() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.checkLocked(o.now())
}

func (o *Outages) checkLocked(t time.Time) {
	if o.last.IsZero() || o.down || t.Sub(o.last) <= o.f.Gap {
		return
	}
	o.down = true
	if o.f.OnDown != nil {
		o.f.OnDown(o.outageLocked(t, false))
	}
}

func (o *Outages) outageLocked(t time.Time, ended bool) Outage {
	return Outage{Start: o.last.Sub(o.begin), At: o.last, Length: t.Sub(o.last), Ended: ended, Errors: o.errs, FirstErr: o.first}
}

// End returns the outages found, the last with Ended false if the run ends during it.
func (o *Outages) End() []Outage {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := slices.Clone(o.found)
	if t := o.now(); !o.last.IsZero() && t.Sub(o.last) > o.f.Gap {
		out = append(out, o.outageLocked(t, false))
	}
	return out
}

// FailoverResult is what Pool.Failover measured.
type FailoverResult struct {
	// Result counts the acquires (Ops, Errors, FirstErr); its latencies include each lease's release.
	Result
	Outages []Outage
	// ReleaseErrors counts the leases whose release failed; they expire after their TTL.
	ReleaseErrors int
}

// OutageMedian is the median length of the outages (an outage the run ended in counts with its length so
// far); 0 without any.
func (r FailoverResult) OutageMedian() time.Duration {
	l := r.lengths()
	switch n := len(l); {
	case n == 0:
		return 0
	case n%2 == 1:
		return l[n/2]
	default:
		return (l[n/2-1] + l[n/2]) / 2
	}
}

// OutageMax is the longest outage; 0 without any.
func (r FailoverResult) OutageMax() time.Duration {
	if l := r.lengths(); len(l) > 0 {
		return l[len(l)-1]
	}
	return 0
}

func (r FailoverResult) lengths() []time.Duration {
	l := make([]time.Duration, len(r.Outages))
	for i, o := range r.Outages {
		l[i] = o.Length
	}
	slices.Sort(l)
	return l
}

// checkEvery is how often Pool.Failover looks for an outage under way, to tell OnDown: a quarter of the
// gap, within 1 ms..100 ms. The outages' lengths come from the operations' own times, not from it.
func checkEvery(gap time.Duration) time.Duration {
	return min(max(gap/4, time.Millisecond), 100*time.Millisecond)
}

// Failover runs one worker (o.Clients is ignored) for o.Duration or o.MaxOps operations: each takes a
// lease on a fresh resource (prefix/0/SEQ, with ttl; holders as Acquire's) and releases it at once. Every
// gap longer than f.Gap between two consecutive successful acquires is an outage, as a client of the
// SDK sees it (the SDK retries within each operation's o.OpTimeout). A release that fails is counted and
// leaves its lease to expire after ttl. Failover's goroutines have ended when it returns.
func (p *Pool) Failover(ctx context.Context, o Options, prefix string, ttl time.Duration, f Failover) (FailoverResult, error) {
	o.Clients = 1
	if err := errors.Join(o.Validate(), f.Validate()); err != nil {
		return FailoverResult{}, err
	}
	outages := NewOutages(f, time.Now)
	var releaseErrs atomic.Int64
	op := func(ctx context.Context, worker, seq int) error {
		l, err := p.take(ctx, prefix, worker, seq, ttl)
		if err != nil {
			outages.Failed(err)
			return err
		}
		outages.Succeeded()
		if err := l.Release(ctx); err != nil {
			releaseErrs.Add(1)
		}
		return nil
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(checkEvery(f.Gap))
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				outages.Check()
			}
		}
	})
	r, err := Run(ctx, o, op)
	close(stop)
	wg.Wait()
	if err != nil {
		return FailoverResult{}, err
	}
	return FailoverResult{Result: r, Outages: outages.End(), ReleaseErrors: int(releaseErrs.Load())}, nil
}
