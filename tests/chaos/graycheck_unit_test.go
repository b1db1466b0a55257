package chaos

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leased/leased/client"
	"github.com/leased/leased/tests/internal/proc"
)

// The log checker and the L1 checker on hand-made histories: each bad one is caught, the good ones pass.

// logFixture is a run of one resource "r" in history time (ns): events with the time the watcher saw
// them, and ops.
func logEvents(t0 time.Time, evs ...event) []event {
	for i := range evs {
		evs[i].Seen = t0.Add(time.Duration(evs[i].Seen.UnixNano())) // Seen carries an offset in the fixture
	}
	return evs
}

func ev(ty client.EventType, idx uint64, holder string, tok uint64, seenAt int64) event {
	return evOn("r", ty, idx, holder, tok, seenAt)
}

func evOn(res string, ty client.EventType, idx uint64, holder string, tok uint64, seenAt int64) event {
	return event{Type: ty, Index: idx, Resource: res, Holder: holder, Token: tok, Seen: time.Unix(0, seenAt)}
}

// freshAcq is a first-attempt grant on another resource: it bounds the windows of what returned before
// it was called.
func freshAcq(res, holder string, call, ret int64, tok uint64) op {
	return op{Client: 9, In: opInput{Kind: opAcquire, Resource: res, Holder: holder, ReqID: holder + "1"},
		Out: opOutput{Out: outOK, Holder: holder, Token: tok}, Call: call, Return: ret}
}

func TestCheckAnswersAgainstTheLog(t *testing.T) {
	t0 := time.Now()
	// On r: grant a/5 at index 5 (seen at 15), released at 8 (seen at 45), grant b/10 (seen at 75),
	// expired at 12 (seen at 105). Fresh acquires of other resources (token 11 called at 92, token 20
	// called at 200) bound the windows of what returned before them.
	events := logEvents(t0,
		ev(client.Granted, 5, "a", 5, 15), ev(client.Released, 8, "a", 5, 45),
		ev(client.Granted, 10, "b", 10, 75), evOn("o1", client.Granted, 11, "y", 11, 96),
		ev(client.Expired, 12, "b", 10, 105), evOn("o2", client.Granted, 20, "z", 20, 205))
	bound2, bound := freshAcq("o1", "y", 92, 94, 11), freshAcq("o2", "z", 200, 210, 20)
	good := []op{
		acq(0, "a", "a1", 0, 20, outOK, "a", 5),
		acq(1, "c", "c1", 22, 30, outHeld, "a", 5),
		rel(0, 5, 40, 50, outOK),
		get(2, 55, 60, outNotFound, "", 0),
		acq(1, "b", "b1", 70, 80, outOK, "b", 10),
		get(2, 85, 90, outOK, "b", 10),
		rel(1, 10, 110, 120, outNotFound), // expired before the call
		bound2, bound,
	}
	if n, v, rel := checkAnswers(good, events, t0, nil, 30); len(v)+len(rel) != 0 || n != len(good) {
		t.Fatalf("good history: %d checked, %v %v", n, v, rel)
	}
	for name, bad := range map[string]op{
		// the release that made index 8 answered NOT_FOUND (the SDK's lost-first-answer defect); the
		// model lets a lease expire at any moment, so porcupine accepts this
		"release made by the call answered NOT_FOUND": rel(0, 5, 40, 50, outNotFound),
		"release OK with no release in the log":       rel(1, 10, 80, 90, outOK),
		"NOT_FOUND for a token live throughout":       rel(1, 10, 80, 90, outNotFound),
		"grant the log does not contain":              acq(3, "d", "d1", 120, 130, outOK, "d", 14),
		"grant to another holder":                     acq(3, "d", "d1", 60, 80, outOK, "d", 10),
		"held while the log has it free":              acq(3, "d", "d1", 50, 60, outHeld, "a", 5),
		"get sees a lease that has expired":           get(3, 110, 120, outOK, "b", 10),
		"get NOT_FOUND while held throughout":         get(3, 80, 90, outNotFound, "", 0),
	} {
		ops := []op{acq(0, "a", "a1", 0, 20, outOK, "a", 5), acq(1, "b", "b1", 70, 75, outOK, "b", 10), bad, bound2, bound}
		if bad.In.Kind != opRelease || bad.In.Token != 5 {
			ops = append(ops, rel(0, 5, 40, 50, outOK)) // the release that made index 8, so only bad is wrong
		}
		_, v, rel := checkAnswers(ops, events, t0, nil, 30)
		if v = append(v, rel...); len(v) == 0 {
			t.Errorf("%s: not caught", name)
		} else {
			t.Logf("%s: %s", name, v[0])
		}
	}
	// A RELEASED event that no release of its token explains: a Release that ignored its token and freed
	// this lease (the plantbug server), answering some other token's release.
	if _, v, _ := checkAnswers([]op{acq(0, "a", "a1", 0, 20, outOK, "a", 5), bound2, bound}, events, t0, nil, 30); len(v) != 1 || !strings.Contains(v[0], "no release of 5 explains it") {
		t.Errorf("a release nobody asked for: %v", v)
	}
	// That defect is reported apart (log-release: enforced only with LEASED_CHAOS_STRICT=1).
	if _, v, rel := checkAnswers([]op{acq(0, "a", "a1", 0, 20, outOK, "a", 5), rel(0, 5, 40, 50, outNotFound), bound2, bound}, events, t0, nil, 30); len(v) != 0 || len(rel) != 1 {
		t.Errorf("the lost-first-answer release: %v, %v", v, rel)
	}
	// A NOT_FOUND is not blamed for a release that another release of the token, whose answer was
	// unknown, may have made.
	ops := []op{acq(0, "a", "a1", 0, 20, outOK, "a", 5), rel(0, 5, 40, 50, outNotFound), rel(0, 5, 41, 49, outUnknown), bound2, bound}
	if _, v, rel := checkAnswers(ops, events, t0, nil, 30); len(v)+len(rel) != 0 {
		t.Errorf("a release explained by a concurrent unknown one: %v %v", v, rel)
	}
}

func TestCheckL1(t *testing.T) {
	s := time.Second
	nems := []nemesisRec{
		{Name: "freeze-leader", Nodes: []int{0}, Start: 10 * s, End: 15 * s},
		{Name: "blackhole-client-leader", Clients: []string{"l1h0"}, Start: 30 * s, End: 35 * s},
	}
	leases := []l1Lease{
		{Holder: "l1h0", Resource: "l1/0/0", Token: 3, TTL: s, Acquired: 5 * s, Ended: 12 * s, Reason: "lost-contact"},
		{Holder: "l1h1", Resource: "l1/1/0", Token: 4, TTL: 2 * s, Acquired: 5 * s, Ended: 20 * s, Reason: "released"},
		{Holder: "l1h0", Resource: "l1/0/1", Token: 9, TTL: s, Acquired: 29 * s, Ended: 33 * s, Reason: "expired"},
		{Holder: "w1", Resource: "hot/0/0", Token: 11, TTL: 500 * time.Millisecond, Acquired: 29 * s, Ended: 33 * s, Reason: "expired"}, // under the floor
	}
	acqs := []l1Acquire{
		{Holder: "l1h2", Resource: "l1/2/0", Start: 11 * s, Took: 5 * s, OK: true},
		{Holder: "l1h2", Resource: "l1/2/1", Start: 40 * s, Took: 300 * time.Millisecond, OK: true},
	}
	ops := []op{acq(0, "a", "a1", int64(11*s), int64(14*s), outUnknown, "", 0)}
	rep, v := checkL1(3, s, 60*s, nems, leases, acqs, ops)
	if len(v) != 3 {
		t.Fatalf("violations: %v", v)
	}
	f := rep.Rows["freeze-leader"]
	if f.Lost != 1 || f.SlowAcquires != 1 || f.MaxAcquire != 5*s || f.MaxStall != 3*s || f.Injected != 1 {
		t.Errorf("freeze row: %+v", f)
	}
	if b := rep.Rows["blackhole-client-leader"]; b.Lost != 1 {
		t.Errorf("blackhole row: %+v", b)
	}
	if !strings.Contains(rep.String(), "freeze-leader") {
		t.Error(rep.String())
	}
	// Two faults impairing two of three nodes at once: no majority, nothing is L1's business.
	two := append([]nemesisRec{{Name: "kill-follower", Nodes: []int{1}, Start: 9 * s, End: 16 * s}}, nems...)
	if _, v := checkL1(3, s, 60*s, two, leases[:1], nil, nil); len(v) != 0 {
		t.Errorf("minority window counted: %v", v)
	}
	// Two leader faults on different nodes, one after the other inside the lease's last TTL: a majority
	// was up throughout, but the floor promises one failover per TTL. Reported, not a violation; with
	// the first fault ended longer than l1Aftermath before the window it is a violation again.
	lease := l1Lease{Holder: "l1h0", Resource: "l1/0/2", Token: 20, TTL: 2 * s, Acquired: 40 * s, Ended: 50 * s, Reason: "expired"}
	for _, c := range []struct {
		firstEnd  time.Duration
		violation bool
	}{{48*s + 500*time.Millisecond, false}, {48*s - l1Aftermath - time.Millisecond, true}} {
		seq := []nemesisRec{
			{Name: "kill-leader", Nodes: []int{0}, Start: 47 * s, End: c.firstEnd},
			{Name: "freeze-leader", Nodes: []int{1}, Start: 49 * s, End: 49*s + 500*time.Millisecond},
		}
		rep, v := checkL1(3, s, 60*s, seq, []l1Lease{lease}, nil, nil)
		if got := len(v) == 1; got != c.violation {
			t.Errorf("first fault ended at %v: violations %v", c.firstEnd, v)
		}
		if want := map[bool]int{false: 1, true: 0}[c.violation]; rep.Rows["freeze-leader"].LostTwice != want {
			t.Errorf("first fault ended at %v: row %+v", c.firstEnd, rep.Rows["freeze-leader"])
		}
	}
}

// TestDiskStallWithoutTheHook: a node without the faultinject hook answers 404; the nemesis says so once
// and skips from then on, without asking again; a 400 is logged and nothing is recorded as injected.
func TestDiskStallWithoutTheHook(t *testing.T) {
	var calls atomic.Int32
	status := atomic.Int32{}
	status.Store(http.StatusNotFound)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		calls.Add(1)
		if req.Method != http.MethodPost || req.URL.Path != "/debug/fault/disk-stall" || req.URL.Query().Get("duration") != "1s" {
			t.Errorf("unexpected request %s %s", req.Method, req.URL)
		}
		w.WriteHeader(int(status.Load()))
	}))
	defer srv.Close()
	newRun := func() *run {
		return &run{t: t, hist: newHistory(), stats: &counters{ops: map[string]int{}, faults: map[string]int{}},
			c: &cluster{Cluster: &proc.Cluster{Nodes: []*proc.Node{{AdminAddr: strings.TrimPrefix(srv.URL, "http://")}}}}}
	}
	r := newRun()
	r.diskStall(context.Background(), 0, time.Second)
	r.diskStall(context.Background(), 0, time.Second)
	if calls.Load() != 1 || r.stats.faults["disk-stall-skipped"] != 2 || len(r.nemLog) != 0 {
		t.Errorf("404: %d calls, faults %v, log %v", calls.Load(), r.stats.faults, r.nemLog)
	}
	status.Store(http.StatusBadRequest)
	r = newRun()
	r.diskStall(context.Background(), 0, time.Second)
	if len(r.nemLog) != 0 || r.diskHookMissing.Load() {
		t.Errorf("400: log %v", r.nemLog)
	}
}

// TestClientNetBlackHole: a black-holed link holds bytes both ways without closing the connection, a
// dial hangs until the hole heals, and everything held flows on afterwards.
func TestClientNetBlackHole(t *testing.T) {
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
	addr := echo.Addr().String()
	cn := newClientNet([]string{addr})
	dial := func(ctx context.Context, name string) (net.Conn, error) {
		d := &holeDialer{cn: cn, name: name}
		return d.dial(ctx, addr)
	}
	c, err := dial(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cn.blackhole(0, "a")
	got := make(chan string, 1)
	go func() {
		buf := make([]byte, 4)
		_, _ = io.ReadFull(c, buf)
		got <- string(buf)
	}()
	wrote := make(chan error, 1)
	go func() { _, err := c.Write([]byte("ping")); wrote <- err }() // held, like a full socket buffer
	select {
	case s := <-got:
		t.Fatalf("read %q through a black hole", s)
	case <-time.After(200 * time.Millisecond): // nothing may arrive meanwhile
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	if _, err := dial(ctx, "a"); err == nil {
		t.Error("a dial went through a black hole")
	}
	cancel()
	if b, err := dial(context.Background(), "b"); err != nil { // another client's link is unaffected
		t.Errorf("client b: %v", err)
	} else {
		b.Close()
	}
	cn.heal()
	select {
	case s := <-got:
		if s != "ping" {
			t.Errorf("after heal: %q", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("nothing flowed after heal")
	}
	if err := <-wrote; err != nil {
		t.Errorf("write: %v", err)
	}
}

// TestStallCheckerFindsAStalledLeadersClaim: a disk-stalled n1 that still names itself the leader two
// election timeouts after n2 was seen leading in a later term is reported; a claim within the grace, in
// the same term, or an answer naming no leader is not.
func TestStallCheckerFindsAStalledLeadersClaim(t *testing.T) {
	const grace = 400 * time.Millisecond
	ms := func(v int) time.Duration { return time.Duration(v) * time.Millisecond }
	base := []statusObs{
		{Node: 0, At: ms(0), Term: 3, Leads: true}, // before the stall bites: it leads
		{Node: 1, At: ms(0), Term: 3},
		{Node: 1, At: ms(300), Term: 4, Leads: true}, // n2 elected in a later term
	}
	cases := []struct {
		name  string
		obs   statusObs
		found bool
	}{
		{"claim after the grace", statusObs{Node: 0, At: ms(800), Term: 3, Leads: true}, true},
		{"claim within the grace", statusObs{Node: 0, At: ms(650), Term: 3, Leads: true}, false},
		{"names no leader", statusObs{Node: 0, At: ms(800), Term: 3}, false},
		{"caught up to the later term", statusObs{Node: 0, At: ms(800), Term: 4, Leads: true}, false},
	}
	for _, c := range cases {
		v := checkStallClaims(0, append(slices.Clone(base), c.obs), grace)
		if got := len(v) > 0; got != c.found {
			t.Errorf("%s: findings %v, want found %v", c.name, v, c.found)
		}
	}
	if v := checkStallClaims(1, append(slices.Clone(base), statusObs{Node: 1, At: ms(900), Term: 4, Leads: true}), grace); len(v) != 0 {
		t.Errorf("the new leader's own claims were reported: %v", v)
	}
}
