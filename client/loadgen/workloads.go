package loadgen

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/leased/leased/client"
)

// WorkersPerClient is how many workers share one SDK client (one connection per node); both sides of the
// comparison in bench/ group their workers the same way.
const WorkersPerClient = 16

// holderBatch is how many leases one holder name takes before the next name: the cluster refuses more
// than --max-leases-per-holder (10,000 by default) per holder.
const holderBatch = 1000

// Pool is the SDK clients a run's workers share: worker w uses Clients[w % len(Clients)].
type Pool struct {
	Clients []*client.Client
}

// NewPool connects ceil(workers / WorkersPerClient) clients with cfg (whose Holder names them).
func NewPool(cfg client.Config, workers int) (*Pool, error) {
	p := &Pool{}
	for range max((workers+WorkersPerClient-1)/WorkersPerClient, 1) {
		c, err := client.New(cfg)
		if err != nil {
			_ = p.Close()
			return nil, err
		}
		p.Clients = append(p.Clients, c)
	}
	return p, nil
}

// Close closes every client; the leases they hold expire after their TTL.
func (p *Pool) Close() error {
	var errs []error
	for _, c := range p.Clients {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

func (p *Pool) of(worker int) *client.Client { return p.Clients[worker%len(p.Clients)] }

// Acquire takes a lease on a fresh resource per operation (prefix/worker/seq), with ttl, and keeps it
// (the SDK renews it over its KeepAlive stream until the pool closes). Holders rotate every holderBatch
// leases so that no holder reaches the per-holder limit.
func (p *Pool) Acquire(prefix string, ttl time.Duration) Op {
	return func(ctx context.Context, worker, seq int) error {
		_, err := p.take(ctx, prefix, worker, seq, ttl)
		return err
	}
}

// take acquires operation seq's fresh resource, prefix/worker/seq, under the holder of its batch of
// holderBatch.
func (p *Pool) take(ctx context.Context, prefix string, worker, seq int, ttl time.Duration) (*client.Lease, error) {
	holder := fmt.Sprintf("%s-%d-%d", prefix, worker, seq/holderBatch)
	return p.of(worker).Acquire(ctx, fmt.Sprintf("%s/%d/%d", prefix, worker, seq), client.WithTTL(ttl), client.WithHolder(holder))
}

// Contended has every worker queue for one resource (FIFO, WithWait) and release it as soon as it is
// granted: each operation is one handoff.
func (p *Pool) Contended(resource string, ttl time.Duration) Op {
	return func(ctx context.Context, worker, _ int) error {
		l, err := p.of(worker).Acquire(ctx, resource, client.WithTTL(ttl), client.WithWait(),
			client.WithHolder(fmt.Sprintf("%s-%d", resource, worker)))
		if err != nil {
			return err
		}
		return l.Release(ctx)
	}
}

// Churn takes a lease on a fresh resource per operation (prefix/worker/seq) and releases it at once:
// two writes per operation, and a cluster whose held state stays small however long it runs.
func (p *Pool) Churn(prefix string, ttl time.Duration) Op {
	return func(ctx context.Context, worker, seq int) error {
		l, err := p.of(worker).Acquire(ctx, fmt.Sprintf("%s/%d/%d", prefix, worker, seq),
			client.WithTTL(ttl), client.WithHolder(fmt.Sprintf("%s-%d", prefix, worker)))
		if err != nil {
			return err
		}
		return l.Release(ctx)
	}
}

// Renew acquires one lease per worker (prefix/worker) and returns an Op that renews the worker's lease
// once, with a unary Renew. The leases stay held until the pool closes.
func (p *Pool) Renew(ctx context.Context, prefix string, workers int, ttl time.Duration) (Op, error) {
	leases := make([]*client.Lease, workers)
	for w := range workers {
		l, err := p.of(w).Acquire(ctx, fmt.Sprintf("%s/%d", prefix, w), client.WithTTL(ttl),
			client.WithHolder(fmt.Sprintf("%s-%d", prefix, w)))
		if err != nil {
			return nil, fmt.Errorf("acquire the lease to renew: %w", err)
		}
		leases[w] = l
	}
	return func(ctx context.Context, worker, _ int) error {
		l := leases[worker]
		_, err := p.of(worker).Renew(ctx, l.Resource(), l.Token())
		return err
	}, nil
}

// Read takes resource (held with ttl until the pool closes) and returns an Op that reads it once with Get
// and checks that the answer names that lease: linearizable by default (on the leader, after a ReadIndex
// round), or serializable (the answering node's own state: one client round trip, no consensus).
func (p *Pool) Read(ctx context.Context, resource string, ttl time.Duration, serializable bool) (Op, error) {
	l, err := p.Clients[0].Acquire(ctx, resource, client.WithTTL(ttl), client.WithHolder(resource))
	if err != nil {
		return nil, fmt.Errorf("acquire the lease to read: %w", err)
	}
	var opts []client.ReadOption
	if serializable {
		opts = append(opts, client.Serializable())
	}
	return func(ctx context.Context, worker, _ int) error {
		info, err := p.of(worker).Get(ctx, resource, opts...)
		if err != nil {
			return err
		}
		if info.Token != l.Token() {
			return fmt.Errorf("read %s: token %d, want the held lease's %d", resource, info.Token, l.Token())
		}
		return nil
	}, nil
}
