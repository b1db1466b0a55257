package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/leasepb"
)

// Lease is a lease this client holds and keeps alive. Its validity is counted conservatively on this
// machine's clock from when the last successful renewal was *sent*, less the clock-drift margin, so Done
// closes before the cluster can grant the resource to anyone else. Fencing (Fenced, client/fence) covers
// pauses longer than the configured drift allows for.
type Lease struct {
	c        *Client
	resource string
	holder   string
	token    uint64
	ttl      time.Duration
	limit    int
	margin   time.Duration // Fenced refuses to start with less than this left

	ctx    context.Context
	cancel context.CancelCauseFunc

	mu         sync.Mutex
	value      []byte // replaced by Proclaim
	validUntil time.Time
	timer      Timer
	err        error
}

// Token is the fencing token: pass it to every write the lease protects.
func (l *Lease) Token() uint64 { return l.token }

// Resource is the leased resource's name.
func (l *Lease) Resource() string { return l.resource }

// Holder is the holder name the lease was granted to.
func (l *Lease) Holder() string { return l.holder }

// TTL is the lease's time to live.
func (l *Lease) TTL() time.Duration { return l.ttl }

// Value is the payload stored with the lease: as granted, or as last proclaimed by this Lease.
func (l *Lease) Value() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.value
}

// Limit is the number of slots of the semaphore this lease is one slot of (WithLimit); 0 for a plain
// lease.
func (l *Lease) Limit() int { return l.limit }

// Proclaim replaces the lease's value, keeping its token and TTL: a leader announcing a new address
// without giving up its term. Observers see the new value (Observe, Watch's ValueChanged). It is safe to
// retry; an error wrapping ErrNotFound means the lease is no longer current.
func (l *Lease) Proclaim(ctx context.Context, value []byte) error {
	if err := l.Err(); err != nil {
		return err
	}
	info, err := l.c.Proclaim(ctx, l.resource, l.token, value)
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.value = info.Value
	l.mu.Unlock()
	return nil
}

// Done is closed once the lease can no longer be trusted: released, expired, lost contact, or the client
// closed. Err says which.
func (l *Lease) Done() <-chan struct{} { return l.ctx.Done() }

// Context is cancelled when Done closes; context.Cause(l.Context()) is Err().
func (l *Lease) Context() context.Context { return l.ctx }

// Err is nil while the lease is held, then ErrReleased, ErrExpired, ErrLostContact or ErrClosed.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Remaining is how long the lease can still be trusted, measured conservatively: from when its last
// successful renewal was sent, less the drift margin. Zero once it ended.
func (l *Lease) Remaining() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return 0
	}
	return max(l.validUntil.Sub(l.c.clock.Now()), 0)
}

// Fenced runs fn with the lease's token, unless less than the lease's safety margin remains (ErrTooLate) or
// the lease has ended (its Err). fn's context is cancelled when the lease ends. The write fn makes must
// still be fenced by the resource (client/fence): a pause inside fn can outlast the lease.
func (l *Lease) Fenced(ctx context.Context, fn func(ctx context.Context, token uint64) error) error {
	if err := l.Err(); err != nil {
		return err
	}
	if left := l.Remaining(); left < l.margin {
		return fmt.Errorf("%w: %v left, the safety margin is %v", ErrTooLate, left, l.margin)
	}
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(l.ctx, func() { cancel(context.Cause(l.ctx)) })
	defer stop()
	return fn(fctx, l.token)
}

// Release stops renewing the lease and releases it on the cluster (best effort: if the cluster cannot be
// reached, the lease simply expires after its TTL). Done closes with ErrReleased. The error is as for
// Client.Release: nil also when an earlier attempt's lost answer had released it, ErrNotFound when it
// expired first, ErrOutcomeUnknown when no answer says which.
func (l *Lease) Release(ctx context.Context) error {
	l.c.keeper.remove(l)
	l.end(ErrReleased)
	return l.c.Release(ctx, l.resource, l.token)
}

// extend moves the validity window after a renewal sent at sentAt was acknowledged with ttl.
func (l *Lease) extend(sentAt time.Time, ttl time.Duration) {
	until := l.c.cfg.validUntil(sentAt, ttl)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil || !until.After(l.validUntil) {
		return
	}
	l.validUntil = until
	l.armLocked()
}

// armLocked (re)starts the watchdog that ends the lease when its validity runs out. The real clock's
// timer is reset: every renewal of every lease re-arms it, and a new timer each time was half of what the
// SDK spent applying a KeepAlive answer (CPU profile of a 256-worker acquire load). Any other Clock gets a
// new timer from its AfterFunc: a timer's Reset takes a real duration, which is not the Clock's own when
// it runs at another pace.
func (l *Lease) armLocked() {
	d := l.validUntil.Sub(l.c.clock.Now())
	if t, ok := l.timer.(*time.Timer); ok && l.c.clock == Clock(realClock{}) {
		t.Reset(d) // a run of checkValidity this starts or races finds the lease valid and re-arms it
		return
	}
	if l.timer != nil {
		l.timer.Stop()
	}
	l.timer = l.c.clock.AfterFunc(d, func() { l.checkValidity() })
}

// checkValidity ends the lease if its validity ran out, and otherwise arms the watchdog again: a timer
// can fire before the Clock says the time has come (a Reset racing its run, or a Clock whose timers
// keep another pace), and a watchdog that gave up then would never end the lease.
func (l *Lease) checkValidity() {
	l.mu.Lock()
	if l.err != nil {
		l.mu.Unlock()
		return
	}
	if l.c.clock.Now().Before(l.validUntil) {
		l.armLocked()
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	l.c.keeper.remove(l)
	l.end(ErrLostContact)
}

// end marks the lease untrustworthy, once.
func (l *Lease) end(why error) {
	l.mu.Lock()
	if l.err != nil {
		l.mu.Unlock()
		return
	}
	l.err = why
	if l.timer != nil {
		l.timer.Stop()
	}
	l.mu.Unlock()
	l.c.metrics.leaseEnded(why)
	l.cancel(why)
}

// validUntil is the conservative end of a validity window that started when a request was sent.
func (cfg *Config) validUntil(sentAt time.Time, ttl time.Duration) time.Time {
	margin := time.Duration(float64(ttl)*cfg.ClockDrift) + cfg.MinDriftMargin
	return sentAt.Add(ttl - margin)
}

// AcquireOption configures Acquire.
type AcquireOption func(*acquireOptions)

type acquireOptions struct {
	ttl, lockDelay, margin time.Duration
	value                  []byte
	limit                  int
	holder, requestID      string
	wait                   bool
}

// WithTTL sets the lease's TTL (default 10s).
func WithTTL(d time.Duration) AcquireOption { return func(o *acquireOptions) { o.ttl = d } }

// WithValue stores a payload with the lease (at most 4 KiB), e.g. a leader's address.
func WithValue(v []byte) AcquireOption { return func(o *acquireOptions) { o.value = v } }

// WithHolder overrides the client's holder name for this lease.
func WithHolder(h string) AcquireOption { return func(o *acquireOptions) { o.holder = h } }

// WithWait blocks until the resource is granted (FIFO among waiters) or ctx ends. If ctx ends while the
// resource is still held, Acquire returns an error wrapping ErrHeld (errors.As gives the *HeldError the
// cluster last answered with), not a context error.
func WithWait() AcquireOption { return func(o *acquireOptions) { o.wait = true } }

// WithRequestID sets the idempotency key. By default each Acquire call draws a random one and reuses it for
// every retry of that call, so an ambiguous timeout never yields two grants or a false "held". Give the
// id of an earlier call to learn that call's outcome (its grant, if it made one).
func WithRequestID(id string) AcquireOption { return func(o *acquireOptions) { o.requestID = id } }

// WithLimit makes the resource a counting semaphore of n slots: the lease is one slot, with its own
// token, and at most n slots are held at once (n in 1..1000). Every holder of the resource must ask the
// same n; another n while slots are held is refused with ErrInvalid. WithWait queues FIFO for a free
// slot. A slot takes no lock-delay.
func WithLimit(n int) AcquireOption { return func(o *acquireOptions) { o.limit = n } }

// WithLockDelay keeps the resource ungrantable for d after an involuntary loss (expiry).
func WithLockDelay(d time.Duration) AcquireOption { return func(o *acquireOptions) { o.lockDelay = d } }

// WithSafetyMargin is the least remaining validity Fenced requires before starting (default TTL/10).
func WithSafetyMargin(d time.Duration) AcquireOption { return func(o *acquireOptions) { o.margin = d } }

// acquisition is one Acquire call in progress: its request, the numbering of its attempts (waiting or
// not), and the safety margin of the lease it makes.
type acquisition struct {
	c      *Client
	req    *leasepb.AcquireRequest
	in     *intent
	margin time.Duration
}

// now is Acquire without WithWait: one request, retried as call retries.
func (a *acquisition) now(ctx context.Context) (*Lease, error) {
	resp, sentAt, err := a.once(ctx, a.req, callOptions{})
	if err != nil {
		return nil, err
	}
	return a.granted(ctx, resp, sentAt)
}

// waiting is Acquire WithWait (the attempts share the request id, so they are one intent).
//
// With a deadline on ctx at least oneRequestWait away it sends one waiting request, whose wait ends a
// little before the deadline (AcquireRequest.wait_ms, set per attempt by intent.send): the cluster then
// answers it as a request without wait, a grant or "held" with the holder, and a "held" is returned as
// the wait's end (an error wrapping ErrHeld, the *HeldError of that answer). A wait that can end only by
// a cancel, which no answer follows, or so soon that the answer might come too late, first asks without
// waiting (a free resource is granted at once, a held one is answered with its holder) and only then
// queues; ctx ending while queued returns that held answer. A timeout or ErrUnavailable comes back only
// when the cluster never answered.
func (a *acquisition) waiting(ctx context.Context) (*Lease, error) {
	waiting := proto.CloneOf(a.req)
	waiting.Wait = true
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) >= oneRequestWait {
		a.in.waitEnds = deadline
		resp, sentAt, err := a.once(ctx, waiting, callOptions{unbounded: true})
		var held *HeldError
		if errors.As(err, &held) {
			return nil, &waitEndedError{held: held, cause: context.DeadlineExceeded}
		}
		if err != nil {
			return nil, err
		}
		return a.granted(ctx, resp, sentAt)
	}
	// A blocking acquire may wait as long as the caller allows; each attempt is not time-boxed.
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 365*24*time.Hour)
		defer cancel()
	}
	resp, sentAt, err := a.once(ctx, a.req, callOptions{})
	if err == nil {
		return a.granted(ctx, resp, sentAt)
	}
	var held *HeldError
	if !errors.As(err, &held) {
		return nil, err
	}
	resp, sentAt, err = a.once(ctx, waiting, callOptions{unbounded: true})
	if err != nil {
		if ctx.Err() != nil {
			return nil, &waitEndedError{held: held, cause: context.Cause(ctx)}
		}
		return nil, err
	}
	// The grant happened when the resource freed, at a moment this client cannot know but after the
	// waiting attempt was sent: trusting it from that send time is safe, as for any fresh grant, and
	// granted renews it first if the wait used up too much of that window.
	return a.granted(ctx, resp, sentAt)
}

// oneRequestWait is the shortest wait a waiting Acquire sends as one request: its wait ends a tenth of
// it before the caller's deadline, at least 100 ms, room for the cluster's answer on a busy machine.
const oneRequestWait = time.Second

// granted holds the lease an Acquire answer grants. A fresh grant was made by the entry of the attempt
// sent at sentAt, or for a waiting attempt by a later entry (the release that handed it over, or its own
// once the resource freed), so it is valid until sentAt + TTL less the drift margin. A replayed answer
// repeats a grant made earlier under the same request id (an earlier attempt whose answer was lost, or an
// earlier call with the same WithRequestID): the cluster may expire it long before a fresh TTL, so its
// validity is sentAt + remaining_ms (the leader's count when it answered, after sentAt) less the drift
// margin. If either leaves less than a renewal interval (TTL/3), as after a long wait, the lease is
// renewed before Acquire returns.
func (a *acquisition) granted(ctx context.Context, resp *leasepb.AcquireResponse, sentAt time.Time) (*Lease, error) {
	pl := resp.GetLease()
	ttl := ttlOf(pl)
	until := a.c.cfg.validUntil(sentAt, ttl)
	if resp.GetReplayed() {
		remaining := time.Duration(pl.GetRemainingMs()) * time.Millisecond
		until = until.Add(min(remaining, ttl) - ttl)
	}
	if until.Sub(a.c.clock.Now()) < ttl/3 {
		renewedAt, err := a.renewNow(ctx, pl)
		if err != nil {
			return nil, fmt.Errorf("renew the grant (token %d): %w", pl.GetToken(), err)
		}
		until = a.c.cfg.validUntil(renewedAt, ttl)
	}
	return hold(a.c, pl, until, a.margin)
}

func ttlOf(pl *leasepb.Lease) time.Duration { return time.Duration(pl.GetTtlMs()) * time.Millisecond }

// once sends one Acquire request (retried as call retries) and follows the leader it names. It
// returns when the attempt that got the answer was sent: a grant that is not a replay was made by that
// attempt's entry, so it is no older than that (connecting, discovery and earlier attempts do not count).
// If no attempt learned whether the grant happened, the error wraps ErrOutcomeUnknown: a grant may exist,
// which an Acquire with the same request id returns (Acquire names it: OutcomeRequestID), or which
// expires after its TTL.
func (a *acquisition) once(ctx context.Context, req *leasepb.AcquireRequest, o callOptions) (*leasepb.AcquireResponse, time.Time, error) {
	var sentAt time.Time
	o.sent = &sentAt
	resp, err := callWrite(ctx, a.c, "acquire", o, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) (*leasepb.AcquireResponse, error) {
		return a.in.sendAttempt(ctx, a.c.endpoints.writer(conn), req, opts...)
	}, nil)
	if err != nil {
		return nil, time.Time{}, err
	}
	a.c.endpoints.follow(resp.GetHeader())
	return resp, sentAt, nil
}

// renewNow renews a lease synchronously and returns when the renewal was sent.
func (a *acquisition) renewNow(ctx context.Context, pl *leasepb.Lease) (time.Time, error) {
	sentAt := a.c.clock.Now()
	_, err := a.c.Renew(ctx, pl.GetResource(), pl.GetToken())
	return sentAt, err
}

// hold starts keeping a granted lease alive, trusting it until validUntil.
func hold(c *Client, pl *leasepb.Lease, validUntil time.Time, margin time.Duration) (*Lease, error) {
	l := &Lease{
		c: c, resource: pl.GetResource(), holder: pl.GetHolder(), token: pl.GetToken(),
		ttl: time.Duration(pl.GetTtlMs()) * time.Millisecond, value: pl.GetValue(), margin: margin,
		limit: int(pl.GetLimit()),
	}
	l.ctx, l.cancel = context.WithCancelCause(context.Background())
	c.metrics.leaseHeld() // until end
	l.mu.Lock()
	l.validUntil = validUntil
	l.armLocked()
	l.mu.Unlock()
	if err := c.keeper.add(l, validUntil); err != nil {
		l.end(err)
		return nil, err
	}
	return l, nil
}

func newRequestID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
