package client

import (
	"context"
	"errors"
	"sync"
	"time"
)

// An Elector runs a candidate in a leader election the way users of client-go's leaderelection know:
// Run campaigns, calls OnStartedLeading with a context that ends with the leadership, calls
// OnStoppedLeading when it ends, campaigns again after a loss, and releases the lease when its context
// is cancelled. OnNewLeader reports every leader it observes, itself included.
//
// Unlike client-go's lease-object lock, leadership here is a lease the cluster grants: its fencing token
// is the term's epoch, strictly larger for every later term, and the lease's validity is counted from
// renewal send times, so OnStartedLeading's context ends before the cluster can elect anyone else (I4).
// Writes a leader makes should carry the token (Lease.Fenced, client/fence) to cover pauses beyond that.

// LeaderCallbacks are the hooks of an Elector. OnStartedLeading is required; the others may be nil.
type LeaderCallbacks struct {
	// OnStartedLeading runs, in its own goroutine, when this candidate becomes leader. ctx ends when the
	// leadership does (the lease is lost, released or Run's context ends); lease.Token() is the term's
	// fencing token. The Elector waits for it to return before it reports OnStoppedLeading and campaigns
	// again, so a term's code never overlaps the next term's. Returning early does not resign (as in
	// client-go): the candidate keeps the lease until ctx ends; to resign, cancel Run's context.
	OnStartedLeading func(ctx context.Context, lease *Lease)
	// OnStoppedLeading runs after a term ends and OnStartedLeading has returned.
	OnStoppedLeading func()
	// OnNewLeader runs for every leader observed, this candidate included: a new term, or the leader's
	// new value after a Proclaim. It is called from one goroutine, in order.
	OnNewLeader func(LeaderInfo)
}

// ElectorConfig configures an Elector.
type ElectorConfig struct {
	// Resource is the election's name: the leader holds a lease on it.
	Resource string
	// Value identifies this candidate to observers (an address, an id); stored with the lease.
	Value []byte
	// TTL of the leadership lease (default 10s): how long the cluster waits before electing another
	// candidate after this one dies.
	TTL time.Duration
	// RetryPeriod is the pause after a failed campaign before the next (default 1s).
	RetryPeriod time.Duration
	Callbacks   LeaderCallbacks
}

// Elector is one candidate. Create it with Client.NewElector; Run it once.
type Elector struct {
	c   *Client
	cfg ElectorConfig

	mu      sync.Mutex
	leading *Lease // the current term's lease while leading
}

// Run campaigns until ctx ends: it waits (FIFO among candidates) for the lease, leads until the lease
// ends, and campaigns again. When ctx ends while leading, it releases the lease so that the next
// candidate is elected at once. It returns ctx's cause, or an error a campaign cannot get past (an
// invalid request, a denied permission).
func (e *Elector) Run(ctx context.Context) error {
	var observer sync.WaitGroup
	octx, stopObserving := context.WithCancel(ctx)
	defer func() { stopObserving(); observer.Wait() }()
	if e.cfg.Callbacks.OnNewLeader != nil {
		observer.Go(func() { e.observe(octx) })
	}
	for {
		lease, err := e.c.Campaign(ctx, e.cfg.Resource, e.cfg.Value, WithTTL(e.cfg.TTL))
		switch {
		case ctx.Err() != nil:
			if err == nil { // elected as Run ended: resign at once
				e.resign(ctx, lease)
			}
			return context.Cause(ctx)
		case errors.Is(err, ErrInvalid), errors.Is(err, ErrPermissionDenied), errors.Is(err, ErrUnauthenticated), errors.Is(err, ErrClosed):
			return err
		case err != nil:
			if err := sleepCtx(ctx, e.cfg.RetryPeriod); err != nil {
				return context.Cause(ctx)
			}
			continue
		}
		e.lead(ctx, lease)
	}
}

// lead runs one term: OnStartedLeading until the lease ends or ctx does, then the release (on ctx's
// end) and OnStoppedLeading.
func (e *Elector) lead(ctx context.Context, lease *Lease) {
	e.setLeading(lease)
	termCtx, endTerm := context.WithCancelCause(lease.Context())
	stop := context.AfterFunc(ctx, func() { endTerm(context.Cause(ctx)) })
	var term sync.WaitGroup
	term.Go(func() { e.cfg.Callbacks.OnStartedLeading(termCtx, lease) })
	<-termCtx.Done()
	stop()
	term.Wait()
	e.setLeading(nil)
	if ctx.Err() != nil {
		e.resign(ctx, lease) // so the next candidate is elected now rather than after a TTL
	}
	endTerm(nil)
	if e.cfg.Callbacks.OnStoppedLeading != nil {
		e.cfg.Callbacks.OnStoppedLeading()
	}
}

// resign releases lease after Run's ctx ended; the release gets its own bounded context.
func (e *Elector) resign(ctx context.Context, lease *Lease) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.TTL)
	defer cancel()
	_ = lease.Release(rctx)
}

func (e *Elector) setLeading(l *Lease) {
	e.mu.Lock()
	e.leading = l
	e.mu.Unlock()
}

// Leading returns the current term's lease while this candidate leads, else nil.
func (e *Elector) Leading() *Lease {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.leading
}

// ErrNotLeading: Proclaim was called while this candidate does not lead.
var ErrNotLeading = errors.New("leased: this candidate is not the leader")

// Proclaim changes the value observers see for the current leader (this candidate), keeping the term's
// token. It returns ErrNotLeading when this candidate does not lead; the value given to NewElector is
// the one a later term starts with.
func (e *Elector) Proclaim(ctx context.Context, value []byte) error {
	l := e.Leading()
	if l == nil {
		return ErrNotLeading
	}
	return l.Proclaim(ctx, value)
}

// observe reports leaders to OnNewLeader until ctx ends, resuming after errors.
func (e *Elector) observe(ctx context.Context) {
	var last LeaderInfo
	for ctx.Err() == nil {
		_ = e.c.Observe(ctx, e.cfg.Resource, func(li LeaderInfo) error {
			if li.Token != 0 && (li.Token != last.Token || string(li.Value) != string(last.Value)) {
				e.cfg.Callbacks.OnNewLeader(li)
			}
			last = li
			return nil
		})
		if sleepCtx(ctx, e.cfg.RetryPeriod) != nil {
			return
		}
	}
}
