package chaos

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/client"
)

// Each checker is shown to catch a hand-made bad history, and to pass the matching good one.

func acq(c int, h, req string, call, ret int64, out outcome, holder string, tok uint64) op {
	return op{Client: c, In: opInput{Kind: opAcquire, Resource: "r", Holder: h, ReqID: req},
		Out: opOutput{Out: out, Holder: holder, Token: tok}, Call: call, Return: ret}
}

func rel(c int, tok uint64, call, ret int64, out outcome) op {
	return op{Client: c, In: opInput{Kind: opRelease, Resource: "r", Token: tok}, Out: opOutput{Out: out}, Call: call, Return: ret}
}

func get(c int, call, ret int64, out outcome, holder string, tok uint64) op {
	return op{Client: c, In: opInput{Kind: opGet, Resource: "r"}, Out: opOutput{Out: out, Holder: holder, Token: tok}, Call: call, Return: ret}
}

func TestModelAcceptsCorrectHistories(t *testing.T) {
	for name, h := range map[string][]op{
		"expiry between operations": {
			acq(0, "a", "a1", 0, 10, outOK, "a", 5),
			acq(1, "b", "b1", 20, 30, outOK, "b", 7), // a's lease may have expired
			get(2, 40, 50, outOK, "b", 7),
		},
		"unknown acquire revealed by a get": {
			acq(0, "a", "a1", 0, 10, outUnknown, "", 0),
			get(1, 20, 30, outOK, "a", 9),
			acq(2, "b", "b1", 40, 50, outHeld, "a", 9),
		},
		"unknown acquire that never happened": {
			acq(0, "a", "a1", 0, 10, outUnknown, "", 0),
			get(1, 20, 30, outNotFound, "", 0),
			acq(2, "b", "b1", 40, 50, outOK, "b", 3),
		},
		"retry with the same request id replays": {
			acq(0, "a", "a1", 0, 10, outUnknown, "", 0),
			acq(0, "a", "a1", 20, 30, outOK, "a", 4),
			rel(0, 4, 40, 50, outOK),
			rel(1, 4, 60, 70, outNotFound),
		},
		"concurrent acquires, one wins": {
			acq(0, "a", "a1", 0, 30, outHeld, "b", 6),
			acq(1, "b", "b1", 5, 20, outOK, "b", 6),
		},
	} {
		if res := porcupine.CheckOperationsTimeout(leaseModel.ToModel(), porcupineOps(h), 5*time.Second); res != porcupine.Ok {
			t.Errorf("%s: %v, want Ok", name, res)
		}
	}
}

func TestModelRejectsBadHistories(t *testing.T) {
	for name, h := range map[string][]op{
		"release of a token never granted succeeds": {
			acq(0, "a", "a1", 0, 10, outOK, "a", 5),
			rel(0, 7, 20, 30, outOK),
		},
		"release of the current token by a stale holder fails, then the lease is gone": {
			acq(0, "a", "a1", 0, 10, outOK, "a", 5),
			rel(1, 5, 20, 30, outNotFound),
			get(2, 40, 50, outOK, "a", 5),
		},
		"two holders at once": {
			acq(0, "a", "a1", 0, 10, outOK, "a", 5),
			get(2, 15, 16, outOK, "a", 5),
			acq(1, "b", "b1", 20, 30, outOK, "b", 7),
			get(2, 40, 50, outOK, "a", 5),
		},
		"token goes backwards": {
			acq(0, "a", "a1", 0, 10, outOK, "a", 9),
			rel(0, 9, 20, 30, outOK),
			acq(1, "b", "b1", 40, 50, outOK, "b", 7),
		},
		"a read sees a released lease": {
			acq(0, "a", "a1", 0, 10, outOK, "a", 5),
			rel(0, 5, 20, 30, outOK),
			get(1, 40, 50, outOK, "a", 5),
		},
	} {
		if res := porcupine.CheckOperationsTimeout(leaseModel.ToModel(), porcupineOps(h), 5*time.Second); res != porcupine.Illegal {
			t.Errorf("%s: %v, want Illegal", name, res)
		}
	}
	// On failure the visualisation is written.
	v := checkLinearizable([]op{acq(0, "a", "a1", 0, 10, outOK, "a", 9), get(1, 20, 30, outNotFound, "", 0), get(1, 40, 50, outOK, "a", 9)}, t.TempDir(), 5*time.Second)
	if v.Result != porcupine.Illegal || v.Visual == "" {
		t.Errorf("checkLinearizable = %+v", v)
	}
}

func TestCheckGrants(t *testing.T) {
	t0 := time.Now()
	g := func(i uint64, r string) event {
		return event{Type: client.Granted, Index: i, Resource: r, Token: i, Seen: t0.Add(time.Duration(i))}
	}
	end := func(ty client.EventType, i uint64, r string, tok uint64) event {
		return event{Type: ty, Index: i, Resource: r, Token: tok, Seen: t0.Add(time.Duration(i))}
	}
	sent := map[releaseKey]time.Time{{"r", 1}: t0}
	good := []event{g(1, "r"), end(client.Released, 2, "r", 1), g(3, "r"), end(client.Expired, 4, "r", 3), g(5, "s")}
	if v := checkGrants(good, sent, nil); len(v) != 0 {
		t.Errorf("good stream: %v", v)
	}
	for name, bad := range map[string][]event{
		"grant while live (I2)":       {g(1, "r"), g(3, "r")},
		"token reused (I1)":           {g(1, "r"), end(client.Released, 2, "r", 1), {Type: client.Granted, Index: 3, Resource: "s", Token: 1}},
		"release of another token":    {g(1, "r"), end(client.Released, 2, "r", 1), g(3, "r"), end(client.Released, 4, "r", 3)},
		"ended token is not the live": {g(1, "r"), end(client.Expired, 2, "r", 7)},
	} {
		if v := checkGrants(bad, sent, nil); len(v) == 0 {
			t.Errorf("%s: not caught", name)
		}
	}

	lease := func(r string, tok uint64) *leasepb.Lease { return &leasepb.Lease{Resource: r, Token: tok, Holder: "h"} }
	same := []nodeState{{applied: 5, leases: []*leasepb.Lease{lease("s", 5)}}, {applied: 5, leases: []*leasepb.Lease{lease("s", 5)}}}
	if v := checkStates(same, good, true); len(v) != 0 {
		t.Errorf("identical states: %v", v)
	}
	diverged := []nodeState{{applied: 5, leases: []*leasepb.Lease{lease("s", 5)}}, {applied: 5, leases: []*leasepb.Lease{lease("s", 4)}}}
	if v := checkStates(diverged, nil, false); len(v) == 0 {
		t.Error("diverged node states: not caught")
	}
	otherIdentity := lease("s", 5)
	otherIdentity.Identity = "bob"
	mixed := []nodeState{{applied: 5, leases: []*leasepb.Lease{lease("s", 5)}}, {applied: 5, leases: []*leasepb.Lease{otherIdentity}}}
	if v := checkStates(mixed, nil, false); len(v) == 0 {
		t.Error("a lease under another identity on one node: not caught")
	}
	double := []nodeState{{applied: 5, leases: []*leasepb.Lease{lease("s", 4), lease("s", 5)}}}
	if v := checkStates(double, nil, false); len(v) == 0 {
		t.Error("two grants on one resource: not caught")
	}
}

func TestCheckDurableCatchesLostAcknowledgedGrant(t *testing.T) {
	recs := []durableRecord{{Resource: "d/1", Token: 10}, {Resource: "d/2", Token: 11, Released: true}, {Resource: "d/3", Token: 12, Unsure: true}}
	if v := checkDurable(recs, map[string]uint64{"d/1": 10}); len(v) != 0 {
		t.Errorf("good: %v", v)
	}
	if v := checkDurable(recs, map[string]uint64{}); len(v) != 1 {
		t.Errorf("lost acknowledged grant: %v", v)
	}
	if v := checkDurable(recs, map[string]uint64{"d/1": 10, "d/2": 11}); len(v) != 1 {
		t.Errorf("lost acknowledged release: %v", v)
	}
}

func TestCheckBeliefsCatchesOverlappingHolders(t *testing.T) {
	t0 := time.Now()
	a := belief{Resource: "r", Token: 5, Holder: "a", Acquired: t0, LastValid: t0.Add(900 * time.Millisecond), DoneSeen: t0.Add(950 * time.Millisecond)}
	b := belief{Resource: "r", Token: 8, Holder: "b", Acquired: t0.Add(time.Second), LastValid: t0.Add(2 * time.Second)}
	if v, loose := checkBeliefs([]belief{a, b}); len(v) != 0 || loose != 0 {
		t.Errorf("sequential holders: %v %d", v, loose)
	}
	a.LastValid = t0.Add(1100 * time.Millisecond) // a still trusted its lease after b's grant was acknowledged
	a.DoneSeen = t0.Add(1200 * time.Millisecond)
	if v, loose := checkBeliefs([]belief{b, a}); len(v) != 1 || loose != 1 {
		t.Errorf("overlapping holders: %v %d", v, loose)
	}
}

func TestCheckFenceCatchesStaleAcceptance(t *testing.T) {
	good := []write{{"r", 5, "a1"}, {"r", 5, "a2"}, {"r", 8, "b1"}}
	if rep, v := checkFence(good, map[string]string{"r": "b1"}); len(v) != 0 || rep.Accepted != 3 {
		t.Errorf("good: %+v %v", rep, v)
	}
	stale := []write{{"r", 5, "a1"}, {"r", 8, "b1"}, {"r", 5, "a-after-pause"}}
	rep, v := checkFence(stale, map[string]string{"r": "a-after-pause"})
	if rep.StaleAccepted != 1 || rep.LostUpdates != 1 || len(v) != 2 {
		t.Errorf("stale acceptance: %+v %v", rep, v)
	}
}

// TestFaultProxy checks the proxy on its own: CONNECT through it, a cut refuses and closes, heal restores.
func TestFaultProxy(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	p, err := newFaultProxy([]string{"127.0.0.1:1", echo.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	_, port, _ := net.SplitHostPort(echo.Addr().String())
	dial := func() (net.Conn, error) {
		c, err := net.Dial("tcp", strings.TrimPrefix(p.url(0), "http://"))
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(c, "CONNECT %s:%s HTTP/1.1\r\nHost: %s:%s\r\n\r\n", peerHost(1), port, peerHost(1), port)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			c.Close()
			return nil, err
		}
		if resp.StatusCode != 200 {
			c.Close()
			return nil, fmt.Errorf("status %d", resp.StatusCode)
		}
		return c, nil
	}
	c, err := dial()
	if err != nil {
		t.Fatal(err)
	}
	_, _ = c.Write([]byte("ping"))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo through the proxy: %q %v", buf, err)
	}
	p.cut(0, 1)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(buf); err == nil {
		t.Error("a cut link kept its connection open")
	}
	c.Close()
	if c, err := dial(); err == nil {
		c.Close()
		t.Error("a cut link accepted a connection")
	}
	p.heal()
	c, err = dial()
	if err != nil {
		t.Fatalf("after heal: %v", err)
	}
	c.Close()
}

func TestCheckSemaphoresCatchesMoreThanLimit(t *testing.T) {
	g := func(i uint64, r string, limit int) event {
		return event{Type: client.Granted, Index: i, Resource: r, Token: i, Limit: limit}
	}
	end := func(i uint64, r string, tok uint64) event {
		return event{Type: client.Released, Index: i, Resource: r, Token: tok, Limit: 2}
	}
	good := []event{g(1, "s", 2), g(2, "s", 2), end(3, "s", 1), g(4, "s", 2), end(5, "s", 2), end(6, "s", 4), g(7, "s", 3)}
	if v := checkSemaphores(good, nil); len(v) != 0 {
		t.Errorf("good stream: %v", v)
	}
	for name, bad := range map[string][]event{
		"three live of two":     {g(1, "s", 2), g(2, "s", 2), g(3, "s", 2)},
		"limits disagree":       {g(1, "s", 2), g(2, "s", 3)},
		"token not the index":   {g(1, "s", 2), {Type: client.Granted, Index: 2, Resource: "s", Token: 1, Limit: 2}},
		"end of a dead slot":    {g(1, "s", 2), end(2, "s", 1), end(3, "s", 1)},
		"end of an unknown one": {g(1, "s", 2), end(2, "s", 9)},
	} {
		if v := checkSemaphores(bad, nil); len(v) == 0 {
			t.Errorf("%s: not caught", name)
		}
	}
	slot := func(tok uint64) *leasepb.Lease {
		return &leasepb.Lease{Resource: "s", Token: tok, Limit: 2, Holder: "h"}
	}
	if v := checkSemaphoreStates([]nodeState{{applied: 5, slots: []*leasepb.Lease{slot(1), slot(2)}}, {applied: 5, slots: []*leasepb.Lease{slot(1), slot(2)}}}); len(v) != 0 {
		t.Errorf("good states: %v", v)
	}
	if v := checkSemaphoreStates([]nodeState{{applied: 5, slots: []*leasepb.Lease{slot(1), slot(2), slot(3)}}}); len(v) == 0 {
		t.Error("three slots of two in a state: not caught")
	}
	if v := checkSemaphoreStates([]nodeState{{applied: 5, slots: []*leasepb.Lease{slot(1)}}, {applied: 5, slots: []*leasepb.Lease{slot(2)}}}); len(v) == 0 {
		t.Error("nodes disagreeing on the slots: not caught")
	}
}
