package loadgen

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/client"
)

// The batched keep-alive load: many leases held through the raw API (the SDK would keep them alive on
// its own schedule) and renewed, a batch of them per KeepAlive request, as fast as the streams allow.
// Its parts: Leader and Dial (a connection to the leader), TakeLeases (fill), KeepAlive (the renewals,
// an Op per batch), ReleaseLeases (the cleanup).

// MaxBatch is the most leases one KeepAlive request may name: the servers' default
// --max-keepalive-leases (a cluster configured lower refuses larger batches).
const MaxBatch = 10_000

// MaxLeases is the most leases a keep-alive load may hold: the servers' default --max-leases.
const MaxLeases = 1_000_000

// FillWorkers is how many acquires or releases TakeLeases and ReleaseLeases keep in flight when their
// callers have no reason to choose otherwise.
const FillWorkers = 64

// ErrIncomplete: Fill (or TakeLeases, ReleaseLeases) did not get through every item within its duration.
var ErrIncomplete = errors.New("not done in time")

// KeepAliveOptions shape a batched keep-alive load.
type KeepAliveOptions struct {
	// Leases is how many leases are held and renewed (1..MaxLeases).
	Leases int
	// Batch is how many leases one KeepAlive request names (1..MaxBatch, at most Leases).
	Batch int
	// Streams is how many KeepAlive streams renew them, each with one request in flight (1..MaxClients).
	Streams int
}

// Validate says what is wrong with o, if anything.
func (o KeepAliveOptions) Validate() error {
	switch {
	case o.Leases < 1 || o.Leases > MaxLeases:
		return fmt.Errorf("leases must be in 1..%d, not %d", MaxLeases, o.Leases)
	case o.Batch < 1 || o.Batch > MaxBatch:
		return fmt.Errorf("batch must be in 1..%d, not %d", MaxBatch, o.Batch)
	case o.Batch > o.Leases:
		return fmt.Errorf("batch (%d) must not exceed leases (%d)", o.Batch, o.Leases)
	case o.Streams < 1 || o.Streams > MaxClients:
		return fmt.Errorf("streams must be in 1..%d, not %d", MaxClients, o.Streams)
	}
	return nil
}

// Dial connects to one node's client port for calls of the raw API (api/leasepb): with TLS when tlsCfg
// is set (its client certificate is the identity the cluster sees), and the SDK's fixed receive windows
// (a KeepAlive answer for 1,000 leases is about 50 KB). It does not wait for the connection; close it
// when done.
func Dial(addr string, tlsCfg *tls.Config) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if tlsCfg != nil {
		creds = credentials.NewTLS(tlsCfg)
	}
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(creds),
		grpc.WithInitialWindowSize(1<<20), grpc.WithInitialConnWindowSize(4<<20))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", addr, err)
	}
	return conn, nil
}

// Leader asks every endpoint of c at once for its status (each bounded by c's RequestTimeout and ctx) and
// returns the endpoint that answers as the leader, as c spells it; when none does, the leader's client
// address as an answering node names it. It fails with the first endpoint's error when none answers,
// and with client.ErrUnavailable when no answering node knows a leader.
func Leader(ctx context.Context, c *client.Client) (string, error) {
	eps := c.Endpoints()
	sts := make([]*client.NodeStatus, len(eps))
	errs := make([]error, len(eps))
	var wg sync.WaitGroup
	for i, ep := range eps {
		wg.Go(func() { sts[i], errs[i] = c.Status(ctx, ep) })
	}
	wg.Wait()
	named := ""
	for i, st := range sts {
		switch {
		case errs[i] != nil:
		case st.GetRole() == leasepb.Role_ROLE_LEADER:
			return eps[i], nil
		case named == "":
			named = st.GetHeader().GetLeaderAddr()
		}
	}
	if named != "" {
		return named, nil
	}
	for _, err := range errs {
		if err != nil {
			return "", fmt.Errorf("find the leader: %w", err)
		}
	}
	return "", fmt.Errorf("find the leader: %w: no node knows one", client.ErrUnavailable)
}

// Fill runs fn once for every i in [0, o.MaxOps) on o.Clients workers, each call bounded by o.OpTimeout,
// and returns the first failure: it starts no call after one, nor after o.Duration (then the error wraps
// ErrIncomplete), nor after ctx ends. o.MaxOps 0 runs nothing.
func Fill(ctx context.Context, o Options, fn func(ctx context.Context, i int) error) error {
	if err := o.Validate(); err != nil || o.MaxOps == 0 {
		return err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	r, err := Run(ctx, o, func(ctx context.Context, _, _ int) error {
		err := fn(ctx, int(next.Add(1)-1))
		if err != nil {
			cancel(err) // the first failure is the cause; the calls it cuts short fail after it
		}
		return err
	})
	switch {
	case err != nil:
		return err
	case context.Cause(ctx) != nil: // the first failure, or ctx's own end
		return context.Cause(ctx)
	case r.Ops < o.MaxOps:
		return fmt.Errorf("%w: %d of %d within %v", ErrIncomplete, r.Ops, o.MaxOps, o.Duration)
	}
	return nil
}

// TakeLeases acquires o.MaxOps leases through api, as Fill runs them: on prefix/0, prefix/1, ..., with
// ttl, under holders prefix-0, prefix-1, ... that change every 1,000 leases (below the servers'
// --max-leases-per-holder). It returns the leases taken, in the order of their names, also when it
// fails, so that the caller can release them. Errors are the SDK's (client.FromStatus).
func TakeLeases(ctx context.Context, api leasepb.LeasesClient, o Options, prefix string, ttl time.Duration) ([]*leasepb.LeaseRef, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	refs := make([]*leasepb.LeaseRef, o.MaxOps)
	err := Fill(ctx, o, func(ctx context.Context, i int) error {
		resource := fmt.Sprintf("%s/%d", prefix, i)
		resp, err := api.Acquire(ctx, &leasepb.AcquireRequest{
			Resource: resource, Holder: fmt.Sprintf("%s-%d", prefix, i/holderBatch), TtlMs: ttl.Milliseconds(),
		})
		if err != nil {
			return fmt.Errorf("acquire %s: %w", resource, client.FromStatus(err))
		}
		refs[i] = &leasepb.LeaseRef{Resource: resp.GetLease().GetResource(), Token: resp.GetLease().GetToken()}
		return nil
	})
	return slices.DeleteFunc(refs, func(r *leasepb.LeaseRef) bool { return r == nil }), err
}

// ReleaseLeases releases refs through api on o.Clients workers, each call bounded by o.OpTimeout and all
// of them by o.Duration and ctx (o.MaxOps is ignored: each ref is tried once). A failure does not stop
// the others; ReleaseLeases returns how many were released and the first failure (ErrIncomplete when
// some were not tried in time). A lease not released expires after its TTL.
func ReleaseLeases(ctx context.Context, api leasepb.LeasesClient, o Options, refs []*leasepb.LeaseRef) (int, error) {
	if len(refs) == 0 {
		return 0, nil
	}
	o.MaxOps = len(refs)
	var next, released atomic.Int64
	r, err := Run(ctx, o, func(ctx context.Context, _, _ int) error {
		ref := refs[next.Add(1)-1]
		if _, err := api.Release(ctx, &leasepb.ReleaseRequest{Resource: ref.GetResource(), Token: ref.GetToken()}); err != nil {
			return fmt.Errorf("release %s: %w", ref.GetResource(), client.FromStatus(err))
		}
		released.Add(1)
		return nil
	})
	n := int(released.Load())
	switch {
	case err != nil:
		return 0, err
	case r.FirstErr != nil:
		return n, r.FirstErr
	case r.Ops < len(refs) && ctx.Err() != nil:
		return n, ctx.Err()
	case r.Ops < len(refs):
		return n, fmt.Errorf("%w: released %d of %d within %v", ErrIncomplete, n, len(refs), o.Duration)
	}
	return n, nil
}

// BatchStart is the first lease (of leases) that operation seq of worker renews when workers take turns
// through the leases, batch at a time: every lease is renewed as often as any other.
func BatchStart(worker, seq, workers, leases, batch int) int {
	return ((seq*workers + worker) * batch) % leases
}

// KeepAlive renews held leases in batches over KeepAlive streams, one stream per worker of a Run: each
// operation of Op sends one request naming a batch of the leases on its worker's stream and waits for
// the answer; the workers take turns through the leases (BatchStart). It counts the leases the cluster
// answered as renewed. A stream that fails, or whose operation ran out of time, is opened again by its
// worker's next operation. Create one with OpenKeepAlive and Close it after the Run.
type KeepAlive struct {
	api   leasepb.LeasesClient
	refs  []*leasepb.LeaseRef
	batch int
	// ctx is every stream's parent; streams[w] is used by worker w alone (and by Close, after the run).
	ctx     context.Context
	cancel  context.CancelFunc
	streams []kaStream
	// renewed and gone count the leases answered as renewed and as no longer current.
	renewed, gone atomic.Int64
}

type kaStream struct {
	stream grpc.BidiStreamingClient[leasepb.KeepAliveRequest, leasepb.KeepAliveResponse]
	cancel context.CancelFunc // ends stream
}

func (s *kaStream) close() {
	if s.stream != nil {
		_ = s.stream.CloseSend()
		s.cancel()
	}
	s.stream, s.cancel = nil, nil
}

// OpenKeepAlive opens streams KeepAlive streams through api (on its connection; ctx ends them) to renew
// refs batch at a time.
func OpenKeepAlive(ctx context.Context, api leasepb.LeasesClient, refs []*leasepb.LeaseRef, streams, batch int) (*KeepAlive, error) {
	if err := (KeepAliveOptions{Leases: len(refs), Batch: batch, Streams: streams}).Validate(); err != nil {
		return nil, err
	}
	k := &KeepAlive{api: api, refs: refs, batch: batch, streams: make([]kaStream, streams)}
	k.ctx, k.cancel = context.WithCancel(ctx)
	for w := range k.streams {
		if err := k.open(ctx, &k.streams[w]); err != nil {
			k.Close()
			return nil, err
		}
	}
	return k, nil
}

// open starts s's stream, giving up when bound ends first.
func (k *KeepAlive) open(bound context.Context, s *kaStream) error {
	sctx, cancel := context.WithCancel(k.ctx)
	stop := context.AfterFunc(bound, cancel)
	st, err := k.api.KeepAlive(sctx)
	if stopped := stop(); err != nil || !stopped {
		cancel()
		if err == nil {
			err = bound.Err()
		}
		return fmt.Errorf("open a keep-alive stream: %w", client.FromStatus(err))
	}
	s.stream, s.cancel = st, cancel
	return nil
}

// Op renews one batch on the worker's stream. It fails when the stream does, and when the answer names
// a lease as not renewed (gone: expired, released or taken over since), the others counted still.
func (k *KeepAlive) Op() Op { return k.renewBatch }

// Renewed is how many leases the cluster answered as renewed so far; Gone how many it answered as no
// longer current.
func (k *KeepAlive) Renewed() int64 { return k.renewed.Load() }

// Gone: see Renewed.
func (k *KeepAlive) Gone() int64 { return k.gone.Load() }

// Close ends every stream. Call it once the Run that used Op has returned.
func (k *KeepAlive) Close() {
	for i := range k.streams {
		k.streams[i].close()
	}
	k.cancel()
}

// errNotRenewed: an answer named leases as gone; the stream itself is fine.
var errNotRenewed = errors.New("not renewed")

func (k *KeepAlive) renewBatch(ctx context.Context, worker, seq int) error {
	s := &k.streams[worker]
	if s.stream == nil {
		if err := k.open(ctx, s); err != nil {
			return err
		}
	}
	// Recv has no deadline of its own: the operation's end cuts the stream.
	stop := context.AfterFunc(ctx, s.cancel)
	err := k.exchange(s.stream, worker, seq)
	if stopped := stop(); !stopped || (err != nil && !errors.Is(err, errNotRenewed)) {
		s.close()
	}
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("keep-alive batch: %w", ctx.Err())
	}
	return err
}

// exchange sends one batch on st and reads its answer.
func (k *KeepAlive) exchange(st grpc.BidiStreamingClient[leasepb.KeepAliveRequest, leasepb.KeepAliveResponse], worker, seq int) error {
	first := BatchStart(worker, seq, len(k.streams), len(k.refs), k.batch)
	req := &leasepb.KeepAliveRequest{Seq: uint64(seq), Leases: make([]*leasepb.LeaseRef, k.batch)}
	for i := range k.batch {
		req.Leases[i] = k.refs[(first+i)%len(k.refs)]
	}
	if err := st.Send(req); err != nil {
		if errors.Is(err, io.EOF) { // the stream ended; Recv says why
			_, err = st.Recv()
		}
		return streamErr(err)
	}
	resp, err := st.Recv()
	if err != nil {
		return streamErr(err)
	}
	if resp.GetSeq() != req.GetSeq() {
		return fmt.Errorf("keep-alive answer %d to request %d", resp.GetSeq(), req.GetSeq())
	}
	renewed, firstGone := 0, ""
	for _, r := range resp.GetResults() {
		if !r.GetGone() && r.GetTtlMs() > 0 {
			renewed++
		} else if firstGone == "" {
			firstGone = r.GetResource()
		}
	}
	k.renewed.Add(int64(renewed))
	if gone := len(resp.GetResults()) - renewed; gone > 0 {
		k.gone.Add(int64(gone))
		return fmt.Errorf("%d of %d leases %w (no longer current: expired, released or taken over), %s the first",
			gone, k.batch, errNotRenewed, firstGone)
	}
	if len(resp.GetResults()) != k.batch {
		return fmt.Errorf("keep-alive answer with %d results for %d leases", len(resp.GetResults()), k.batch)
	}
	return nil
}

// streamErr phrases a stream's failure as the SDK would.
func streamErr(err error) error {
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("keep-alive stream: %w: the server ended it", client.ErrUnavailable)
	}
	return fmt.Errorf("keep-alive stream: %w", client.FromStatus(err))
}
