package client

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leased/leased/api/leasepb"
)

// TestKeeperIntervalFollowsTheShortestTTLHeld: the renewal interval is a third of the shortest TTL among
// the leases held now — it shrinks when a shorter lease arrives and grows back when the last lease of that
// TTL goes, whether it was released or answered gone — and a lease added twice counts once.
func TestKeeperIntervalFollowsTheShortestTTLHeld(t *testing.T) {
	c, err := New(Config{Endpoints: []string{"127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	k := c.keeper
	lease := func(name string, token uint64, ttl time.Duration) *Lease {
		ctx, cancel := context.WithCancelCause(context.Background())
		return &Lease{c: c, resource: name, token: token, ttl: ttl, ctx: ctx, cancel: cancel}
	}
	interval := func(want time.Duration) {
		t.Helper()
		if got := k.interval(); got != want {
			t.Fatalf("interval %v, want %v", got, want)
		}
	}
	long, short, short2 := lease("a", 1, 30*time.Second), lease("b", 2, 3*time.Second), lease("c", 3, 3*time.Second)
	interval(time.Second) // nothing held
	for _, l := range []*Lease{long, short, short2, short} {
		k.mu.Lock()
		k.putLocked(l)
		k.mu.Unlock()
	}
	interval(time.Second)
	k.remove(short)
	interval(time.Second) // short2 still holds the 3 s TTL
	k.mu.Lock()
	k.sent[7] = c.clock.Now()
	k.mu.Unlock()
	k.handle(&leasepb.KeepAliveResponse{Seq: 7, Results: []*leasepb.KeepAliveResult{{Resource: "c", Token: 3, Gone: true}}})
	if !errors.Is(short2.Err(), ErrExpired) {
		t.Fatalf("a lease answered gone: %v, want ErrExpired", short2.Err())
	}
	interval(10 * time.Second)
	k.remove(long)
	interval(time.Second)
	if len(k.leases) != 0 || len(k.ttls) != 0 {
		t.Fatalf("after every lease went: %d leases, ttls %v", len(k.leases), k.ttls)
	}
}

// TestKeeperRequestsCarryEveryLeaseOnce: a round's messages renew every held lease exactly once, at most
// KeepAliveBatch a message, numbered in order, each with its send time recorded; with nothing held the
// round is one empty message.
func TestKeeperRequestsCarryEveryLeaseOnce(t *testing.T) {
	c, err := New(Config{Endpoints: []string{"127.0.0.1:1"}, KeepAliveBatch: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	k := c.keeper
	if reqs := k.nextRequests(); len(reqs) != 1 || len(reqs[0].GetLeases()) != 0 {
		t.Fatalf("nothing held: %v, want one empty message", reqs)
	}
	k.mu.Lock()
	for i := range 10 {
		k.putLocked(&Lease{c: c, resource: "r", token: uint64(100 + i), ttl: time.Second, cancel: func(error) {}})
	}
	k.mu.Unlock()
	reqs := k.nextRequests()
	if len(reqs) != 3 {
		t.Fatalf("10 leases at most 4 a message: %d messages", len(reqs))
	}
	seen := map[uint64]int{}
	for i, req := range reqs {
		if n := len(req.GetLeases()); n == 0 || n > 4 {
			t.Fatalf("message %d carries %d leases", i, n)
		}
		if i > 0 && req.GetSeq() != reqs[i-1].GetSeq()+1 {
			t.Fatalf("seqs %d then %d", reqs[i-1].GetSeq(), req.GetSeq())
		}
		if _, ok := k.sent[req.GetSeq()]; !ok {
			t.Fatalf("no send time for seq %d", req.GetSeq())
		}
		for _, ref := range req.GetLeases() {
			seen[ref.GetToken()]++
		}
	}
	for i := range 10 {
		if seen[uint64(100+i)] != 1 {
			t.Fatalf("token %d renewed %d times in a round", 100+i, seen[uint64(100+i)])
		}
	}
}

// TestNewRefusesANegativeKeepAliveBatch: a negative message size is a configuration error, not a keeper
// that cannot split a round.
func TestNewRefusesANegativeKeepAliveBatch(t *testing.T) {
	if _, err := New(Config{Endpoints: []string{"127.0.0.1:1"}, KeepAliveBatch: -1}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("KeepAliveBatch -1: %v, want ErrInvalid", err)
	}
}

// slowClock runs at rate × real time, and its timers are *time.Timer (they have a Reset, which takes a
// real duration), as a test's or a program's own Clock may be.
type slowClock struct {
	start time.Time
	rate  float64
}

func (c slowClock) Now() time.Time {
	return c.start.Add(time.Duration(float64(time.Since(c.start)) * c.rate))
}

func (c slowClock) AfterFunc(d time.Duration, f func()) Timer {
	return time.AfterFunc(time.Duration(float64(d)/c.rate), f)
}

// TestRenewedLeaseEndsOnAClockOfItsOwn: a lease renewed once and then never again ends with ErrLostContact
// when its validity runs out on the client's Clock, whatever pace that clock's timers keep. (The
// watchdog was re-armed with Reset, which took the clock's duration as a real one: on a slow clock it fired
// early, found the lease still valid and was never armed again, and the lease never ended.)
func TestRenewedLeaseEndsOnAClockOfItsOwn(t *testing.T) {
	c, err := New(Config{Endpoints: []string{"127.0.0.1:1"}, Clock: slowClock{start: time.Now(), rate: 0.9}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	now := c.clock.Now()
	l, err := hold(c, &leasepb.Lease{Resource: "r", Token: 1, TtlMs: 1000}, now.Add(500*time.Millisecond), 0)
	if err != nil {
		t.Fatal(err)
	}
	l.extend(c.clock.Now(), time.Second) // a renewal's answer re-arms the watchdog
	select {
	case <-l.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the lease did not end 10 s after its validity ran out")
	}
	if !errors.Is(l.Err(), ErrLostContact) {
		t.Fatalf("the lease ended with %v, want ErrLostContact", l.Err())
	}
	if left := l.validUntil.Sub(c.clock.Now()); left > 0 {
		t.Fatalf("the lease ended %v before its validity ran out on the client's clock", left)
	}
}
