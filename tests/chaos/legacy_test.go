package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/client"
)

// legacyHolder is the gray-sdk planted bug: an L1 holder on a hand-written client with the two gray-
// failure defects the SDK once had, so the L1 checker can be shown to catch them whatever the SDK does:
//
//   - its KeepAlive stream has no watchdog: it stays on the node it opened the stream to for as long as
//     the stream is open, answers or not (a frozen leader keeps its TCP connections open), and the lease
//     ends only when its validity runs out;
//   - the first attempt of an acquire gets the whole deadline, on the leader the client last knew.
//
// It otherwise behaves like the SDK: validity counted from the send time of the last answered renewal,
// less the 1 % + 20 ms drift margin; a broken stream or an Unavailable answer moves it to the leader the
// answer names, else to the next node.
func (r *run) legacyHolder(ctx context.Context, k int, name string, ttl time.Duration, rng *rand.Rand) {
	eps := r.c.Endpoints()
	conns := map[string]*grpc.ClientConn{}
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	leases := func(addr string) leasepb.LeasesClient {
		c, ok := conns[addr]
		if !ok {
			var err error
			c, err = grpc.NewClient(addr, grpc.WithTransportCredentials(r.c.tls.creds()), r.cnet.dialOption(name))
			if err != nil {
				panic(err) // only on a bad address
			}
			conns[addr] = c
		}
		return leasepb.NewLeasesClient(c)
	}
	addr, next := eps[0], 0
	moveOn := func(err error) {
		if h := leaderHintOf(err); h != "" && h != addr {
			addr = h
			return
		}
		next = (next + 1) % len(eps)
		addr = eps[next]
	}
	for n := 0; n < r.cfg.OpsPerWorker && ctx.Err() == nil; n++ {
		res := fmt.Sprintf("l1/%d/%d", k, n)
		reqID := fmt.Sprintf("%s-%d", name, n)
		start := r.hist.now()
		var lease *leasepb.Lease
		var sentAt time.Time
		for attempt := 0; lease == nil && ctx.Err() == nil; attempt++ {
			left := l1AcquireBudget - time.Duration(r.hist.now()-start)
			if left <= 0 {
				break
			}
			actx, cancel := context.WithTimeout(ctx, left) // the planted bug: one attempt, the whole deadline
			call := r.hist.now()
			sentAt = time.Now()
			resp, err := leases(addr).Acquire(actx, &leasepb.AcquireRequest{Resource: res, Holder: name, TtlMs: ttl.Milliseconds(), RequestId: reqID})
			cancel()
			out := opOutput{Out: outUnknown}
			switch code := status.Code(err); {
			case err == nil:
				lease = resp.GetLease()
				out = opOutput{Out: outOK, Holder: lease.GetHolder(), Token: lease.GetToken()}
				if h := resp.GetHeader().GetLeaderAddr(); h != "" {
					addr = h
				}
			case code == codes.InvalidArgument || code == codes.ResourceExhausted || code == codes.FailedPrecondition:
				out.Out = outFailed // a definite refusal (held cannot happen on a resource of its own)
			default:
				moveOn(err)
			}
			r.hist.add(op{Client: 3000 + k, In: opInput{Kind: opAcquire, Resource: res, Holder: name, ReqID: reqID},
				Out: out, Call: call, Return: r.hist.now(), Attempt: attempt})
			r.stats.op(opAcquire, out.Out)
			if out.Out != outUnknown {
				break
			}
			sleepCtx(ctx, 50*time.Millisecond) // retry pace
		}
		if ctx.Err() != nil && lease == nil {
			return
		}
		r.addL1Acquire(l1Acquire{Holder: name, Resource: res, Start: time.Duration(start), Took: time.Duration(r.hist.now() - start), OK: lease != nil})
		if lease == nil {
			sleepCtx(ctx, 200*time.Millisecond)
			continue
		}
		rec := l1Lease{Holder: name, Resource: res, Token: lease.GetToken(), TTL: ttl, Acquired: time.Duration(r.hist.now()), Ended: -1}
		until := time.Now().Add(3*time.Second + time.Duration(rng.IntN(6000))*time.Millisecond)
		rec.Reason = r.legacyKeep(ctx, leases, &addr, moveOn, lease, ttl, sentAt, until)
		if rec.Reason == "released" {
			tok := lease.GetToken()
			r.release(ctx, 3000+k, res, tok, func(ctx context.Context) error {
				_, err := leases(addr).Release(ctx, &leasepb.ReleaseRequest{Resource: res, Token: tok})
				return fromGRPC(err)
			})
		}
		if rec.Reason != "held" {
			rec.Ended = time.Duration(r.hist.now())
		}
		r.addL1Lease(rec)
		sleepCtx(ctx, time.Duration(100+rng.IntN(400))*time.Millisecond)
	}
}

// legacyKeep keeps lease alive until `until` over KeepAlive streams without a watchdog, and says how it
// ended: released (time to release it), lost-contact (validity ran out), expired (the server said gone)
// or held (the run ended).
func (r *run) legacyKeep(ctx context.Context, leases func(string) leasepb.LeasesClient, addr *string, moveOn func(error),
	lease *leasepb.Lease, ttl time.Duration, sentAt time.Time, until time.Time) string {
	validity := func(sent time.Time) time.Time {
		return sent.Add(ttl - time.Duration(float64(ttl)*0.01) - 20*time.Millisecond)
	}
	var mu sync.Mutex
	validUntil, gone := validity(sentAt), false
	sent := map[uint64]time.Time{}
	seq := uint64(0)
	for ctx.Err() == nil {
		sctx, cancel := context.WithCancel(ctx)
		stream, err := leases(*addr).KeepAlive(sctx)
		if err != nil {
			cancel()
			moveOn(err)
			sleepCtx(ctx, 50*time.Millisecond)
			continue
		}
		recvErr := make(chan error, 1)
		go func() {
			for {
				resp, err := stream.Recv()
				if err != nil {
					recvErr <- err
					return
				}
				mu.Lock()
				if at, ok := sent[resp.GetSeq()]; ok {
					for _, res := range resp.GetResults() {
						if res.GetGone() {
							gone = true
						} else if v := validity(at); v.After(validUntil) {
							validUntil = v
						}
					}
				}
				mu.Unlock()
			}
		}()
		nextSend := time.Now()
		var end string
		for end == "" {
			now := time.Now()
			mu.Lock()
			lost, g := !now.Before(validUntil), gone
			mu.Unlock()
			switch {
			case g:
				end = "expired"
			case lost:
				end = "lost-contact"
			case !now.Before(until):
				end = "released"
			case ctx.Err() != nil:
				end = "held"
			}
			if end != "" {
				break
			}
			if !now.Before(nextSend) {
				mu.Lock()
				seq++
				sent[seq] = now
				req := &leasepb.KeepAliveRequest{Seq: seq, Leases: []*leasepb.LeaseRef{{Resource: lease.GetResource(), Token: lease.GetToken()}}}
				mu.Unlock()
				_ = stream.Send(req) // a send into a stuck stream succeeds: no watchdog notices
				nextSend = now.Add(max(ttl/3, 50*time.Millisecond))
			}
			select {
			case err := <-recvErr:
				moveOn(err)
				end = "reconnect"
			case <-time.After(20 * time.Millisecond): // the holder's check pace
			}
		}
		cancel()
		if end != "reconnect" {
			return end
		}
	}
	return "held"
}

// leaderHintOf extracts the leader hint of an Unavailable status.
func leaderHintOf(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return ""
	}
	for _, d := range st.Details() {
		if h, ok := d.(*leasepb.LeaderHint); ok {
			return h.GetLeaderAddr()
		}
	}
	return ""
}

// fromGRPC maps a raw answer to what classify understands.
func fromGRPC(err error) error {
	switch status.Code(err) {
	case codes.OK:
		return nil
	case codes.NotFound:
		return fmt.Errorf("%w: %w", client.ErrNotFound, err)
	}
	return err
}
