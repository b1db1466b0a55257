package client

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leased/leased/api/leasepb"
)

// keeper renews every lease of a client over one KeepAlive stream. It sends all held leases in one message
// about every TTL/3 (of the shortest TTL held), remembers when each message was sent, and extends each
// lease's validity from that send time when the answer arrives. When the stream breaks it reconnects (to the
// leader the answers name, or the next endpoint) with backoff; leases whose validity runs out meanwhile end
// with ErrLostContact on their own watchdog.
type keeper struct {
	c *Client

	mu     sync.Mutex
	leases map[leaseKey]*Lease
	// ttls counts the held leases of each TTL, so that the renewal interval (a third of the shortest) costs
	// a look at the few TTLs in use, not at every lease: the session asks for it several times a round.
	ttls map[time.Duration]int
	sent map[uint64]time.Time // seq -> send time, for answers still expected
	seq  uint64
	// nextRound is when the running session's next round of renewals is due (zero before the first), on
	// the client's clock.
	nextRound time.Time
	started   bool
	closed    bool
	wake      chan struct{}
	stop      chan struct{}
	done      chan struct{}
	// draining counts abandoned streams still read for late answers (see drain); close waits for them.
	draining sync.WaitGroup
}

type leaseKey struct {
	resource string
	token    uint64
}

// minRenewInterval keeps a client with very short TTLs from flooding the cluster.
const minRenewInterval = 50 * time.Millisecond

func newKeeper(c *Client) *keeper {
	return &keeper{
		c: c, leases: make(map[leaseKey]*Lease), ttls: make(map[time.Duration]int), sent: make(map[uint64]time.Time),
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
}

// add starts renewing l, which the client trusts until validUntil.
func (k *keeper) add(l *Lease, validUntil time.Time) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return ErrClosed
	}
	k.putLocked(l)
	if !k.started {
		k.started = true
		go k.run()
	}
	if k.renewSoonerFor(l.ttl, validUntil) {
		select {
		case k.wake <- struct{}{}:
		default:
		}
	}
	return nil
}

// renewSoonerFor reports whether a new lease needs a round of renewals before the one scheduled: when it
// would reach the scheduled round with less than half its TTL left. A lease renewed in step reaches each
// round with about two thirds of its TTL left, and needs about half: the round's answer is due a sixth of
// the TTL later, and a failover must fit in what remains after that (docs/client.md, "TTL floor"). A
// fresh grant among leases of its TTL needs no round of its own (it was just granted, so it reaches the
// next round with about two thirds left); a lease with a shorter TTL than every one held, or a grant that
// arrived with little of its TTL left (a replay, a long wait), does. Waking for every new lease renewed
// every held lease once per acquire, which made a client that keeps taking leases cost the leader work
// quadratic in what it holds.
func (k *keeper) renewSoonerFor(ttl time.Duration, validUntil time.Time) bool {
	return k.nextRound.IsZero() || validUntil.Sub(k.nextRound) < ttl/2
}

func (k *keeper) remove(l *Lease) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.deleteLocked(leaseKey{l.resource, l.token})
}

// putLocked and deleteLocked keep leases and ttls in step.
func (k *keeper) putLocked(l *Lease) {
	k.deleteLocked(leaseKey{l.resource, l.token})
	k.leases[leaseKey{l.resource, l.token}] = l
	k.ttls[l.ttl]++
}

func (k *keeper) deleteLocked(key leaseKey) {
	l, ok := k.leases[key]
	if !ok {
		return
	}
	delete(k.leases, key)
	if k.ttls[l.ttl]--; k.ttls[l.ttl] == 0 {
		delete(k.ttls, l.ttl)
	}
}

// close stops renewing and ends every held lease with ErrClosed.
func (k *keeper) close() {
	k.mu.Lock()
	k.closed = true
	started := k.started
	held := make([]*Lease, 0, len(k.leases))
	for _, l := range k.leases {
		held = append(held, l)
	}
	k.leases, k.ttls = map[leaseKey]*Lease{}, map[time.Duration]int{}
	k.mu.Unlock()
	close(k.stop)
	if started {
		<-k.done
	}
	k.draining.Wait()
	for _, l := range held {
		l.end(ErrClosed)
	}
}

// run owns the stream: connect, renew on a schedule, reconnect on failure, until stop.
func (k *keeper) run() {
	defer close(k.done)
	for attempt := 0; ; attempt++ {
		if k.session() {
			attempt = 0
		}
		select {
		case <-k.stop:
			return
		default:
		}
		if err := sleepStop(k.stop, k.reconnectPause(attempt)); err != nil {
			return
		}
	}
}

// reconnectPause is the pause before the next session after attempt failed ones: the client's backoff,
// but never more than the watchdog. During an election every node refuses renewals at once ("no
// leader"), and a backoff grown by each quick refusal (up to 2 s) could outlast what a lease at the TTL
// floor has left after the failover: a chaos run lost one 0.5 s after the new leader was elected, its
// keeper asleep in a 0.54 s backoff. Capped, a new session starts within a watchdog of the leader's
// election, at most twice per renewal interval.
func (k *keeper) reconnectPause(attempt int) time.Duration {
	return min(backoff(attempt), k.watchdog())
}

// session runs one KeepAlive stream until it fails, goes unanswered, or the keeper stops; it reports
// whether the next session may start at once (an answer arrived, or the watchdog abandoned the stream)
// rather than after a backoff.
//
// The watchdog: every round of renewals must be answered within watchdog() (half the renewal interval).
// A stream whose answer does not come in time — a frozen node, a black-holed link, a leader stalled on its
// disk — is abandoned, the node is remembered as unresponsive, and the next session renews through
// another node at once, well before the leases' validity runs out. An abandoned stream is still read
// until its answers could no longer extend a lease (drain): a leader that is slow rather than gone — a
// delayed link, a loaded machine — answers late, and a late answer still extends each lease from the
// round's send time.
func (k *keeper) session() bool {
	ctx, cancel := context.WithCancel(k.c.ctx)
	drained := false
	defer func() {
		if !drained {
			cancel()
		}
	}()
	addr := k.c.endpoints.target(ctx)
	conn, err := k.c.endpoints.conn(addr)
	if err != nil {
		return false
	}
	cctx, ccancel := context.WithTimeout(ctx, max(k.watchdog(), 500*time.Millisecond))
	err = k.c.endpoints.ready(cctx, conn)
	ccancel()
	if err != nil {
		if ctx.Err() == nil {
			k.c.endpoints.unresponsive(addr)
		}
		return false
	}
	stream, err := leasepb.NewLeasesClient(conn).KeepAlive(ctx)
	if err != nil {
		k.c.endpoints.moveOn(addr, leaderHint(err))
		return false
	}
	var answered atomic.Uint64 // the newest seq answered on this stream
	notify := make(chan struct{}, 1)
	recvErr := make(chan error, 1)
	go func() { recvErr <- k.receive(stream, &answered, notify) }()
	healthy := false
	// rounds are the renewal rounds still unanswered, oldest first; the watchdog runs for the oldest.
	type round struct {
		seq uint64
		at  time.Time
	}
	var rounds []round
	watchdog := time.NewTimer(time.Hour)
	watchdog.Stop()
	defer watchdog.Stop()
	for {
		// A node that stopped reading fills the stream's flow-control window and Send blocks: the
		// watchdog covers sending too.
		var stuck atomic.Bool
		guard := time.AfterFunc(k.watchdog(), func() { stuck.Store(true); cancel() })
		last, err := k.sendRenewals(stream)
		guard.Stop()
		if err != nil {
			if stuck.Load() {
				k.c.log.Debug("keepalive send stuck; renewing elsewhere", "endpoint", addr, "waited", k.watchdog())
				k.c.endpoints.unresponsive(addr)
			}
			cancel()
			<-recvErr
			return healthy
		}
		if stuck.Load() { // the guard fired just as the send completed
			k.c.endpoints.unresponsive(addr)
			<-recvErr
			return healthy
		}
		if len(rounds) == 0 {
			watchdog.Reset(k.watchdog())
		}
		rounds = append(rounds, round{last, time.Now()})
		timer := k.scheduleNextRound()
	wait:
		for {
			select {
			case <-k.stop:
				timer.Stop()
				cancel()
				<-recvErr
				return healthy
			case err := <-recvErr:
				timer.Stop()
				k.c.endpoints.moveOn(addr, leaderHint(err))
				return healthy
			case <-notify:
				got := answered.Load()
				n := len(rounds)
				for len(rounds) > 0 && rounds[0].seq <= got {
					rounds = rounds[1:]
				}
				if len(rounds) < n {
					healthy = true
					k.c.endpoints.responsive(addr)
					watchdog.Stop()
					if len(rounds) > 0 {
						watchdog.Reset(max(time.Until(rounds[0].at.Add(k.watchdog())), 0))
					}
				}
			case <-watchdog.C:
				timer.Stop()
				k.c.log.Debug("keepalive unanswered; renewing elsewhere", "endpoint", addr, "waited", k.watchdog())
				k.c.endpoints.unresponsive(addr)
				drained = true
				k.drain(rounds[len(rounds)-1].at.Add(3*k.interval()), cancel, recvErr)
				// No backoff before the next session: this one already waited out the watchdog, and a slow
				// node's late answers (which drain still applies) need the renewals to go on at their pace.
				return true
			case <-timer.C:
				break wait
			case <-k.wake:
				timer.Stop()
				break wait
			}
		}
	}
}

// drain keeps reading an abandoned stream in the background — its receive goroutine goes on applying
// answers — until the stream ends, the keeper stops, or the newest round sent on it can no longer extend
// a lease (until: its send time plus the TTL); then it cancels the stream.
func (k *keeper) drain(until time.Time, cancel context.CancelFunc, recvErr <-chan error) {
	k.draining.Add(1)
	go func() {
		defer k.draining.Done()
		defer cancel()
		t := time.NewTimer(time.Until(until))
		defer t.Stop()
		select {
		case <-recvErr:
			return
		case <-t.C:
		case <-k.stop:
		}
		cancel()
		<-recvErr
	}()
}

// receive reads answers until the stream ends, recording the newest seq answered.
func (k *keeper) receive(stream leasepb.Leases_KeepAliveClient, answered *atomic.Uint64, notify chan<- struct{}) error {
	for {
		resp, err := stream.Recv()
		if err != nil {
			return err
		}
		k.c.endpoints.follow(resp.GetHeader())
		k.handle(resp)
		if seq := resp.GetSeq(); seq > answered.Load() {
			answered.Store(seq)
		}
		select {
		case notify <- struct{}{}:
		default:
		}
	}
}

// sendRenewals sends a renewal of every held lease, in messages of at most Config.KeepAliveBatch leases,
// and returns the seq of the last message sent.
func (k *keeper) sendRenewals(stream leasepb.Leases_KeepAliveClient) (uint64, error) {
	var last uint64
	for _, req := range k.nextRequests() {
		if err := stream.Send(req); err != nil {
			return 0, err
		}
		last = req.GetSeq()
	}
	return last, nil
}

// nextRequests builds the renewal messages and records when each is sent. It holds the lock only to copy
// the held leases' keys and to number the messages: a client holding 100,000 leases builds 100,000
// LeaseRefs each round, and every Acquire, answer and release of the client waits for that lock.
func (k *keeper) nextRequests() []*leasepb.KeepAliveRequest {
	k.mu.Lock()
	keys := make([]leaseKey, 0, len(k.leases))
	for key := range k.leases {
		keys = append(keys, key)
	}
	k.mu.Unlock()
	refs := make([]leasepb.LeaseRef, len(keys)) // one allocation, not one a lease
	per := k.c.cfg.KeepAliveBatch
	reqs := make([]*leasepb.KeepAliveRequest, 0, max(1, (len(keys)+per-1)/per))
	for i := 0; i < len(keys) || len(reqs) == 0; i += per { // an empty message keeps the stream (and leader) known
		part := keys[i:min(i+per, len(keys))]
		req := &leasepb.KeepAliveRequest{Leases: make([]*leasepb.LeaseRef, len(part))}
		for j, key := range part {
			ref := &refs[i+j]
			ref.Resource, ref.Token = key.resource, key.token
			req.Leases[j] = ref
		}
		reqs = append(reqs, req)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, req := range reqs {
		req.Seq = k.nextSeqLocked()
	}
	// Answers come in order; anything far older than the newest request will not come any more.
	for seq := range k.sent {
		if seq+uint64(64+len(reqs)) < k.seq {
			delete(k.sent, seq)
		}
	}
	return reqs
}

// nextSeqLocked numbers the next message and records when it is sent (now: before it is).
func (k *keeper) nextSeqLocked() uint64 {
	k.seq++
	k.sent[k.seq] = k.c.clock.Now()
	return k.seq
}

// handle applies one answer: extend each lease from the request's send time, or end it if it is gone.
func (k *keeper) handle(resp *leasepb.KeepAliveResponse) {
	k.mu.Lock()
	sentAt, ok := k.sent[resp.GetSeq()]
	delete(k.sent, resp.GetSeq())
	k.mu.Unlock()
	if !ok {
		return
	}
	k.c.metrics.renewalAnswered(k.c.clock.Now().Sub(sentAt))
	results := resp.GetResults()
	held := make([]*Lease, len(results))
	k.mu.Lock()
	for i, r := range results {
		key := leaseKey{r.GetResource(), r.GetToken()}
		held[i] = k.leases[key]
		if r.GetGone() {
			k.deleteLocked(key)
		}
	}
	k.mu.Unlock()
	for i, r := range results {
		switch l := held[i]; {
		case l == nil:
		case r.GetGone():
			l.end(ErrExpired)
		default:
			l.extend(sentAt, time.Duration(r.GetTtlMs())*time.Millisecond)
		}
	}
}

// watchdog is how long a round of renewals may go unanswered before its stream is abandoned: half the
// renewal interval, at least minWatchdog. With the default TTL/3 interval a renewal that goes to a frozen
// node is retried elsewhere TTL/2 after the last answered one was sent, leaving half the TTL (less the
// drift margin) for the cluster to elect a new leader and answer.
func (k *keeper) watchdog() time.Duration { return max(k.interval()/2, minWatchdog) }

// minWatchdog keeps short TTLs from abandoning streams that are merely slow.
const minWatchdog = 250 * time.Millisecond

// interval is a third of the shortest TTL held.
func (k *keeper) interval() time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.intervalLocked()
}

func (k *keeper) intervalLocked() time.Duration {
	shortest := time.Duration(0)
	for ttl := range k.ttls {
		if shortest == 0 || ttl < shortest {
			shortest = ttl
		}
	}
	if shortest == 0 {
		return time.Second
	}
	return renewInterval(shortest)
}

// renewInterval is how often a lease with this TTL is renewed.
func renewInterval(ttl time.Duration) time.Duration { return max(ttl/3, minRenewInterval) }

// scheduleNextRound starts the timer of the next round of renewals and records when it is due, for add.
func (k *keeper) scheduleNextRound() *time.Timer {
	k.mu.Lock()
	defer k.mu.Unlock()
	d := k.intervalLocked()
	k.nextRound = k.c.clock.Now().Add(d) // the clock validUntil is on
	return time.NewTimer(d)
}

func sleepStop(stop <-chan struct{}, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-stop:
		return ErrClosed
	}
}
