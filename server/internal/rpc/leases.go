package rpc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server/internal/auth"
	"github.com/leased/leased/server/internal/lessor"
	"github.com/leased/leased/server/internal/waitq"
)

// The lease operations. Writes run on the leader, reached through LeaseOps.Write or ServeForward
// (forward.go), which validate them beforehand and stamp the answer's header and status afterwards; reads
// run on any node.

// acquire proposes a grant and, with wait, queues FIFO until the resource frees. A queued acquire is
// granted either by its own entry, proposed when the resource looks free, or by the entry of a release
// that carried it (internal/waitq, "Handoff").
func (o *LeaseOps) acquire(ctx context.Context, req *leasepb.AcquireRequest, identity string) (*leasepb.AcquireResponse, error) {
	if !o.IsLeader() {
		return nil, o.NotLeaderErr()
	}
	if !req.GetWait() {
		return o.acquireOnce(ctx, req, identity)
	}
	id, outcome := o.proposals.Register()
	defer func() { o.proposals.Cancel(id) }()
	w, err := o.queue.Enqueue(req.GetResource(), o.acquireCmd(req, identity), id)
	if err != nil {
		// No room to wait: a resource that looks free is still tried (once); a held one gets the limit's
		// refusal at once, without a log entry, so that a flood of refused waiters writes nothing.
		if o.Held(req.GetResource()) {
			return nil, err
		}
		// Tried once, not queued: its refusal is an answer (the state machine remembers it as one).
		resp, onceErr := o.acquireOnce(ctx, withoutWait(req), identity)
		if errors.Is(onceErr, ErrHeld) {
			return nil, err
		}
		return resp, onceErr
	}
	defer o.queue.Leave(req.GetResource(), w)
	var waitEnds <-chan time.Time // fires when wait_ms runs out; nil: the wait lasts as long as the call
	if ms := req.GetWaitMs(); ms > 0 {
		t := time.NewTimer(time.Duration(ms) * time.Millisecond)
		defer t.Stop()
		waitEnds = t.C
	}
	over := false
	for {
		if resp, err, done := o.tryQueued(ctx, req, identity, w); done {
			return resp, err
		}
		if over && o.queue.Withdraw(req.GetResource(), w) {
			// The wait ran out: answered as the same attempt without wait would be now, a grant if the
			// resource is free, else the held refusal naming the holder. No entry of the attempt is in
			// flight (the queue's own attempts are synchronous, and a carried one was waited for), so a
			// fresh request id's refusal may still come from a read.
			return o.acquireOnce(ctx, withoutWait(req), identity)
		}
		select {
		case <-w.Wake():
		case <-waitEnds:
			waitEnds, over = nil, true
		case out := <-outcome:
			// A release carried this acquire: the entry answers it as its own entry would have.
			if out.Err != nil {
				return nil, out.Err
			}
			resp, err := o.acquireAnswer(req, identity, out.Result)
			if !errors.Is(err, ErrHeld) {
				return resp, err
			}
			id, outcome = o.proposals.Register()
			o.queue.Rearm(w, id)
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-o.done:
			return nil, o.StoppedErr()
		}
	}
}

// withoutWait is req as an attempt that does not queue: the same attempt of the same request id.
func withoutWait(req *leasepb.AcquireRequest) *leasepb.AcquireRequest {
	once := proto.CloneOf(req)
	once.Wait, once.WaitMs = false, 0
	return once
}

// tryQueued proposes a queued acquire's own entry if it heads its queue, no release carries it, and the
// resource looks free. done reports an answer (a grant or a refusal other than held).
func (o *LeaseOps) tryQueued(ctx context.Context, req *leasepb.AcquireRequest, identity string, w *waitq.Waiter) (*leasepb.AcquireResponse, error, bool) {
	head, err := o.queue.Head(req.GetResource(), w)
	if err != nil {
		return nil, err, true
	}
	if !head || !o.worthTrying(req) || !o.queue.Begin(w) {
		return nil, nil, false
	}
	defer o.queue.End(w)
	resp, err := o.acquireOnce(ctx, req, identity)
	return resp, err, !errors.Is(err, ErrHeld)
}

// worthTrying reports whether a blocking acquire at the head of its queue should propose now: not while
// another grant holds the resource, or all its semaphore slots (a release or expiry wakes it), so that waiters joining a held
// resource's queue write nothing to the log. A grant made under the same request id is tried, for the
// state machine to replay it (decision 5); the check errs towards proposing, which is always correct.
func (o *LeaseOps) worthTrying(req *leasepb.AcquireRequest) bool {
	worth := true
	o.ReadFSM(func(sm *fsm.FSM) {
		full := sm.Full(req.GetResource())
		if !full || req.GetRequestId() == "" {
			worth = !full
			return
		}
		// Full: worth it only to replay this request id's own grant (a plain lease, or one of the slots).
		live := sm.Slots(req.GetResource())
		if cur, ok := sm.Get(req.GetResource()); ok && live == nil {
			live = []fsm.Lease{cur}
		}
		worth = slices.ContainsFunc(live, func(l fsm.Lease) bool { return l.RequestID == req.GetRequestId() })
	})
	return worth
}

func (o *LeaseOps) acquireOnce(ctx context.Context, req *leasepb.AcquireRequest, identity string) (*leasepb.AcquireResponse, error) {
	if err := o.AdmitGrant(req.GetResource(), identity); err != nil {
		return nil, err
	}
	res, _, err := o.Propose(ctx, &wirepb.Command{Op: &wirepb.Command_Acquire{Acquire: o.acquireCmd(req, identity)}})
	if err != nil {
		return nil, err
	}
	return o.acquireAnswer(req, identity, res)
}

// acquireCmd is the entry's command for req. With an identity, the per-holder limit counts the holder's
// leases of that identity only, and the identity's leases in all are bounded too (fsm/identities.go).
func (o *LeaseOps) acquireCmd(req *leasepb.AcquireRequest, identity string) *wirepb.AcquireCmd {
	var identityLimit uint32
	if identity != "" {
		identityLimit = uint32(o.cfg.Limits.MaxLeasesPerIdentity)
	}
	return &wirepb.AcquireCmd{
		Resource:    req.GetResource(),
		Holder:      req.GetHolder(),
		TtlMs:       req.GetTtlMs(),
		Value:       req.GetValue(),
		RequestId:   req.GetRequestId(),
		LockDelayMs: req.GetLockDelayMs(),
		Limit:       req.GetLimit(),
		HolderLimit: uint32(o.cfg.Limits.MaxLeasesPerHolder),
		Identity:    identity,
		Attempt:     req.GetAttempt(),
		Wait:        req.GetWait(),
		// Set with an identity only, so that entries without one read exactly as before.
		IdentityLimit:          identityLimit,
		HolderLimitPerIdentity: identity != "",
	}
}

// acquireAnswer turns the FSM's result of an Acquire (its own entry's, or the one a release carried) into
// the answer; held and lock-delayed wrap ErrHeld.
func (o *LeaseOps) acquireAnswer(req *leasepb.AcquireRequest, identity string, res fsm.Result) (*leasepb.AcquireResponse, error) {
	now := o.clock.Now()
	switch res.Code {
	case fsm.OK:
		lease := res.Lease.Proto()
		lease.RemainingMs = o.lessor.Remaining(lease.Resource, lease.Token, now).Milliseconds()
		return &leasepb.AcquireResponse{Lease: lease, Replayed: res.Replayed}, nil
	case fsm.Held:
		return nil, &heldError{detail: &leasepb.LeaseHeld{
			Resource: res.Lease.Resource, Holder: res.Lease.Holder, Token: res.Lease.Token, Identity: res.Lease.Identity,
			RemainingMs: o.lessor.Remaining(res.Lease.Resource, res.Lease.Token, now).Milliseconds(),
			Limit:       res.Lease.Limit,
		}}
	case fsm.LimitMismatch:
		return nil, limitMismatch(req, res.Lease)
	case fsm.LockDelayed:
		return nil, &heldError{detail: &leasepb.LeaseHeld{
			Resource: res.Delay.Resource, LockDelayed: true,
			RemainingMs: o.lessor.DelayRemaining(res.Delay.Resource, now).Milliseconds(),
		}}
	case fsm.HolderLimit:
		if identity != "" {
			return nil, fmt.Errorf("%w: %q holds %d leases of identity %q (--max-leases-per-holder)", ErrHolderLimit, req.GetHolder(), o.cfg.Limits.MaxLeasesPerHolder, identity)
		}
		return nil, fmt.Errorf("%w: %q holds %d leases (--max-leases-per-holder)", ErrHolderLimit, req.GetHolder(), o.cfg.Limits.MaxLeasesPerHolder)
	case fsm.IdentityLimit:
		return nil, limited("--max-leases-per-identity", "identity %q holds %d leases, the most one identity may: new grants to it are refused "+
			"until it releases some or the limit is raised", identity, o.cfg.Limits.MaxLeasesPerIdentity)
	case fsm.Denied:
		return nil, auth.Denied(res.Denial, o.authz.RulesSet())
	case fsm.RequestReused:
		r := res.Reuse
		return nil, invalid(r.Field, "request id %q was first used with %s %s, this request has %s: a retry must repeat the original request (use a new request id for a new one)",
			r.RequestID, r.Field, r.Was, r.Now)
	case fsm.Superseded:
		return nil, &supersededError{stale: res.Stale}
	default:
		return nil, invalid("request", "the state machine refused it (%v)", res.Code)
	}
}

// renew renews one lease (the unary Renew).
func (o *LeaseOps) renew(ctx context.Context, req *leasepb.RenewRequest) (*leasepb.RenewResponse, error) {
	results, err := o.renewAll(ctx, []*leasepb.LeaseRef{{Resource: req.GetResource(), Token: req.GetToken()}})
	if err != nil {
		return nil, err
	}
	if results[0].GetGone() {
		return nil, ErrNotCurrent
	}
	return &leasepb.RenewResponse{TtlMs: results[0].GetTtlMs()}, nil
}

// keepAlive renews the leases of one KeepAlive message; leases no longer current are reported gone.
func (o *LeaseOps) keepAlive(ctx context.Context, req *leasepb.KeepAliveRequest) (*leasepb.KeepAliveResponse, error) {
	results, err := o.renewAll(ctx, req.GetLeases())
	if err != nil {
		return nil, err
	}
	o.metrics.keepAliveSize.Observe(float64(len(results)))
	return &leasepb.KeepAliveResponse{Seq: req.GetSeq(), Results: results}, nil
}

// renewAll renews a batch of leases with one leadership confirmation (decision 4). The first renewal of
// leases marked idle is made durable first, all of them in one Renew entry.
func (o *LeaseOps) renewAll(ctx context.Context, refs []*leasepb.LeaseRef) ([]*leasepb.KeepAliveResult, error) {
	results := make([]*leasepb.KeepAliveResult, len(refs))
	pending := make([]*leasepb.KeepAliveResult, 0, len(refs))
	for i, ref := range refs {
		results[i] = &leasepb.KeepAliveResult{Resource: ref.GetResource(), Token: ref.GetToken()}
		pending = append(pending, results[i])
	}
	// A checkpoint may mark a lease idle while its renewal waits for the confirmation; such leases go
	// round again (through the log). Two rounds suffice unless checkpoints race every time.
	for round := 0; len(pending) > 0; round++ {
		if round == 3 {
			return nil, fmt.Errorf("renewals kept racing checkpoints: %w", ErrTimeout)
		}
		var err error
		if pending, err = o.renewRound(ctx, pending); err != nil {
			return nil, err
		}
	}
	o.metrics.renewed(results)
	return results, nil
}

// renewRound renews the pending leases once; it returns those a checkpoint marked idle meanwhile.
func (o *LeaseOps) renewRound(ctx context.Context, pending []*leasepb.KeepAliveResult) ([]*leasepb.KeepAliveResult, error) {
	batch := make([]lessor.Renewal, len(pending))
	for i, res := range pending {
		batch[i] = lessor.Renewal{Resource: res.Resource, Token: res.Token}
	}
	gen, err := o.lessor.CheckRenewals(batch)
	if err != nil {
		return nil, err
	}
	var idle []*leasepb.LeaseRef
	for _, c := range batch {
		if c.Idle {
			idle = append(idle, &leasepb.LeaseRef{Resource: c.Resource, Token: c.Token})
		}
	}
	if len(idle) > 0 {
		if _, _, err := o.Propose(ctx, &wirepb.Command{Op: &wirepb.Command_Renew{Renew: &wirepb.RenewCmd{Leases: idle}}}); err != nil {
			return nil, err
		}
	}
	if err := o.ConfirmLeadership(ctx); err != nil {
		return nil, err
	}
	at := o.clock.Now() // after the confirmation: never earlier than when the request arrived
	if err := o.lessor.RenewChecked(gen, batch, at); err != nil {
		return nil, err
	}
	var again []*leasepb.KeepAliveResult
	for i, c := range batch {
		switch c.Err { // renewChecked's own sentinels, compared as they are: this runs once a lease renewed
		case ErrNotCurrent:
			pending[i].Gone = true // definite: this node's state reflects every write committed before the request
		case lessor.ErrIdle:
			again = append(again, pending[i])
		default:
			pending[i].TtlMs = c.TTL.Milliseconds()
		}
	}
	return again, nil
}

func (o *LeaseOps) release(ctx context.Context, req *leasepb.ReleaseRequest, identity string) (*leasepb.ReleaseResponse, error) {
	if !o.IsLeader() {
		return nil, o.NotLeaderErr()
	}
	rel := &wirepb.ReleaseCmd{Resource: req.GetResource(), Token: req.GetToken(), Identity: identity}
	cmd := &wirepb.Command{Op: &wirepb.Command_Release{Release: rel}}
	// The head waiter's grant rides in the release's entry (internal/waitq, "Handoff").
	w := o.queue.Claim(req.GetResource())
	if w != nil {
		acq, id := o.queue.Carried(w)
		cmd.Op = &wirepb.Command_ReleaseHandoff{ReleaseHandoff: &wirepb.ReleaseHandoffCmd{Release: rel, Acquire: acq, AcquireProposalId: id}}
		if hook := o.handoffProposing.Load(); hook != nil && *hook != nil {
			(*hook)()
		}
	}
	res, index, err := o.Propose(ctx, cmd)
	if w != nil && err != nil && !errors.Is(err, ErrOutcomeUnknown) {
		o.queue.Unclaim(w) // never entered the log: the waiter goes on as before
	}
	if err != nil {
		return nil, err
	}
	switch {
	case res.Code == fsm.Denied:
		return nil, auth.Denied(res.Denial, o.authz.RulesSet())
	case res.Code == fsm.OK && res.Replayed:
		// An earlier request released this token (a retry whose first answer was lost): that is success.
		return &leasepb.ReleaseResponse{AlreadyReleased: true, ReleasedIndex: res.End.Index}, nil
	case res.Code == fsm.OK:
		return &leasepb.ReleaseResponse{ReleasedIndex: index}, nil
	}
	return nil, &endedError{end: res.End}
}

// read runs fn against a linearizable (default) or serializable view of the state machine.
func (o *LeaseOps) read(ctx context.Context, serializable bool, fn func(sm *fsm.FSM)) error {
	if !serializable {
		if err := o.Linearizable(ctx); err != nil {
			return err
		}
	}
	o.ReadFSM(fn)
	return nil
}

// get reads one lease. Its answer's header carries the applied index of the very state it read (captured
// in the same FSM read), so a client can watch from the next index without missing or repeating an event.
// Reads check the identity's read permission in the same FSM read as the data (internal/auth).
func (o *LeaseOps) get(ctx context.Context, req *leasepb.GetRequest, identity string) (*leasepb.GetResponse, error) {
	var (
		lease   fsm.Lease
		slots   []fsm.Lease
		ok      bool
		applied uint64
		denied  error
	)
	if err := o.read(ctx, req.GetSerializable(), func(sm *fsm.FSM) {
		if denied = auth.Need(sm, identity, req.GetResource(), leasepb.Permission_PERMISSION_READ); denied != nil {
			return
		}
		lease, ok = sm.Get(req.GetResource())
		slots = sm.Slots(req.GetResource())
		applied = sm.AppliedIndex()
	}); err != nil {
		return nil, err
	}
	if denied != nil {
		return nil, denied
	}
	if !ok {
		return nil, ErrNotFound
	}
	now := o.clock.Now()
	shown := func(l fsm.Lease) *leasepb.Lease {
		p := auth.Visible(l, identity, o.cfg.ClientCertAuth)
		p.RemainingMs = o.lessor.Remaining(l.Resource, l.Token, now).Milliseconds()
		return p
	}
	resp := &leasepb.GetResponse{Lease: shown(lease), Header: &leasepb.ResponseHeader{AppliedIndex: applied}}
	for _, s := range slots {
		resp.Slots = append(resp.Slots, shown(s))
	}
	return resp, nil
}

func (o *LeaseOps) list(ctx context.Context, req *leasepb.ListRequest, identity string) (*leasepb.ListResponse, error) {
	limit := int(req.GetLimit())
	if limit == 0 {
		limit = 100
	}
	var (
		leases []fsm.Lease
		more   bool
		denied error
	)
	after, afterSlot, err := parsePageToken(req.GetPageToken())
	if err != nil {
		return nil, err
	}
	err = o.read(ctx, req.GetSerializable(), func(sm *fsm.FSM) {
		if denied = auth.Need(sm, identity, req.GetPrefix(), leasepb.Permission_PERMISSION_READ); denied != nil {
			return
		}
		if req.GetHolder() != "" {
			leases, more = sm.ListHolder(req.GetHolder(), req.GetPrefix(), after, afterSlot, limit)
		} else {
			leases, more = sm.List(req.GetPrefix(), after, afterSlot, limit)
		}
	})
	if err == nil {
		err = denied
	}
	if err != nil {
		return nil, err
	}
	resp := &leasepb.ListResponse{Leases: make([]*leasepb.Lease, 0, len(leases))}
	now := o.clock.Now()
	for _, l := range leases {
		p := auth.Visible(l, identity, o.cfg.ClientCertAuth)
		p.RemainingMs = o.lessor.Remaining(l.Resource, l.Token, now).Milliseconds()
		resp.Leases = append(resp.Leases, p)
	}
	if more && len(leases) > 0 {
		resp.NextPageToken = pageToken(leases[len(leases)-1])
	}
	return resp, nil
}

func (o *LeaseOps) validateToken(ctx context.Context, req *leasepb.ValidateTokenRequest, identity string) (*leasepb.ValidateTokenResponse, error) {
	var (
		cur    uint64
		denied error
	)
	err := o.read(ctx, false, func(sm *fsm.FSM) {
		if denied = auth.Need(sm, identity, req.GetResource(), leasepb.Permission_PERMISSION_READ); denied != nil {
			return
		}
		if l, ok := sm.Current(req.GetResource(), req.GetToken()); ok {
			cur = l.Token // for a semaphore: this slot is current
		} else if l, ok := sm.Get(req.GetResource()); ok {
			cur = l.Token // for a semaphore: its oldest slot
		}
	})
	if err == nil {
		err = denied
	}
	if err != nil {
		return nil, err
	}
	return &leasepb.ValidateTokenResponse{Current: cur != 0 && cur == req.GetToken(), CurrentToken: cur}, nil
}

// proclaim replaces the value of a live lease, keeping its token (the elector's Proclaim).
func (o *LeaseOps) proclaim(ctx context.Context, req *leasepb.ProclaimRequest, identity string) (*leasepb.ProclaimResponse, error) {
	if !o.IsLeader() {
		return nil, o.NotLeaderErr()
	}
	res, _, err := o.Propose(ctx, &wirepb.Command{Op: &wirepb.Command_Proclaim{Proclaim: &wirepb.ProclaimCmd{
		Resource: req.GetResource(), Token: req.GetToken(), Value: req.GetValue(), Identity: identity,
	}}})
	if err != nil {
		return nil, err
	}
	switch res.Code {
	case fsm.OK:
		lease := auth.Visible(res.Lease, identity, o.cfg.ClientCertAuth) // an admin's answer hides the owner's request id
		lease.RemainingMs = o.lessor.Remaining(lease.Resource, lease.Token, o.clock.Now()).Milliseconds()
		return &leasepb.ProclaimResponse{Lease: lease}, nil
	case fsm.Denied:
		return nil, auth.Denied(res.Denial, o.authz.RulesSet())
	}
	return nil, &endedError{end: res.End}
}

// consistentSnapshot encodes the state machine after a linearizable read: it reflects every entry
// committed before the call (and possibly later ones, never fewer). index is the state's applied index.
func (o *LeaseOps) consistentSnapshot(ctx context.Context) (data []byte, index uint64, err error) {
	if err := o.Linearizable(ctx); err != nil {
		return nil, 0, err
	}
	// A view, encoded outside the lock: the apply waits a moment, not for the encoding.
	view := o.view()
	data, err = view.Encode()
	view.Release()
	return data, view.AppliedIndex(), err
}

// limitMismatch is the InvalidArgument of an Acquire whose limit disagrees with the live grants of its
// resource, one of which is cur.
func limitMismatch(req *leasepb.AcquireRequest, cur fsm.Lease) error {
	asked := fmt.Sprintf("a semaphore of %d slots", req.GetLimit())
	if req.GetLimit() == 0 {
		asked = "a plain lease (no limit)"
	}
	if cur.Limit == 0 {
		return invalid("limit", "resource %q is held as a plain lease (token %d), this request asks for %s: every holder of a resource must ask the same limit",
			req.GetResource(), cur.Token, asked)
	}
	return invalid("limit", "resource %q is a semaphore of %d slots, this request asks for %s: every holder of a resource must ask the same limit",
		req.GetResource(), cur.Limit, asked)
}
