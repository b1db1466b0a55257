package chaos

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
)

// The flood nemesis (runConfig.Flood, LEASED_CHAOS_FLOOD=1, make chaos FLOOD=1): a hostile client opens
// more Watch streams on one connection, and more blocking acquires on one resource, than the per-
// connection and per-resource limits allow (the harness runs the nodes with the small
// limits below so that a flood fits a 2-core machine). Its promises, checked as the "limits" checker:
//   - exactly the limit's worth is served and every request past it is refused with ResourceExhausted
//     whose QuotaFailure names the flag that sets the limit;
//   - the flood costs no election (the leader's term is the same after it);
//   - and, through L1 (a flood impairs no node), no healthy holder loses its lease and every acquire of
//     a free resource stays within the bound while the flood is on.
//
// Beside the floods, a mass expiry: a client takes floodMassLeases leases at once and abandons them
// (holders that went together), more than one burst of the nodes' small --expiry-rate, so the leader
// spreads their expiry out. Its promise, also under "limits": every one of them has expired within its TTL
// plus its share of the rate plus floodMassSlack, and the expiry cost no election.

const (
	floodWatchersPerConn    = 150
	floodWaitersPerResource = 150
	floodStreamsPerConn     = 400
	floodExcess             = 40 // requests past each limit
	// The mass expiry: 3,000 leases at 2,000 a second, in bursts of one 1,000-lease batch, take a second
	// past their deadlines to expire.
	floodMassLeases = 3000
	floodExpiryRate = 2000
	floodMassSlack  = 10 * time.Second // a tick, commits and applies on a loaded 2-core machine
)

// floodArgs are the limits every node of the harness runs with.
var floodArgs = []string{
	fmt.Sprintf("--max-watchers-per-conn=%d", floodWatchersPerConn),
	fmt.Sprintf("--max-waiters-per-resource=%d", floodWaitersPerResource),
	fmt.Sprintf("--max-streams-per-conn=%d", floodStreamsPerConn),
	fmt.Sprintf("--expiry-rate=%d", floodExpiryRate),
}

// floodOutcome is what one flood's requests got.
type floodOutcome struct {
	open, refused int            // still served at the end; refused naming the expected flag
	other         map[string]int // any other answer, by gRPC code and QuotaFailure subject
}

func (o floodOutcome) String() string {
	return fmt.Sprintf("%d served, %d refused, other %v", o.open, o.refused, o.other)
}

// floodNemesis floods the leader ld for 2–4 s and records what the checker needs. A flood whose leader
// moved under it (another node answered) says nothing and is counted as skipped.
func (r *run) floodNemesis(ctx context.Context, rng *rand.Rand, ld int) {
	if ld < 0 {
		return
	}
	n := r.c.Nodes[ld]
	before, err := r.c.Status(ctx, ld)
	if err != nil || before.GetRole() != leasepb.Role_ROLE_LEADER {
		r.stats.fault("flood-leader-skipped")
		return
	}
	id := r.faultStart("flood-leader") // no node is impaired: a client misbehaves
	r.floods++
	defer r.faultEnd(id)
	var tlsConf *tls.Config
	if r.c.tls != nil {
		tlsConf = r.c.tls.client
	}
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	hold := 2*time.Second + time.Duration(rng.IntN(2000))*time.Millisecond
	var watch, wait floodOutcome
	var mass massLeases
	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		watch = floodWatch(fctx, n.ClientAddr, tlsConf, hold)
	}()
	go func() {
		defer wg.Done()
		wait = r.floodWait(fctx, n.ClientAddr, tlsConf, hold)
	}()
	go func() {
		defer wg.Done()
		mass = r.takeMassLeases(fctx, n.ClientAddr, tlsConf)
	}()
	wg.Wait()
	cancel()
	if ctx.Err() != nil {
		return // the run ended mid-flood: what was served says nothing
	}
	gone, finding := r.awaitMassExpiry(ctx, n.ClientAddr, tlsConf, mass)
	if finding != "" && ctx.Err() == nil {
		r.floodFinding(finding)
	}
	conns := r.floodConnections(ctx, ld) // connflood_test.go
	after, err := r.c.Status(ctx, ld)
	r.faultNote(id, nil, fmt.Sprintf("watch: %v; wait: %v; mass expiry: %d leases gone %v after the last grant; connections: %v", watch, wait, mass.taken, gone.Round(time.Millisecond), conns))
	if err != nil || after.GetTerm() != before.GetTerm() || after.GetRole() != leasepb.Role_ROLE_LEADER {
		// Another fault cannot overlap (one at a time): the flood itself cost an election, or the node.
		r.floodFinding(fmt.Sprintf("flood on n%d: term %d before, %d after (role %v, err %v): the flood cost an election",
			ld+1, before.GetTerm(), after.GetTerm(), after.GetRole(), err))
		return
	}
	r.checkFloodOutcome("watch", "--max-watchers-per-conn", floodWatchersPerConn, watch)
	r.checkFloodOutcome("wait", "--max-waiters-per-resource", floodWaitersPerResource, wait)
	for _, f := range conns.findings {
		r.floodFinding(f)
	}
}

// massLeases is what takeMassLeases took: under prefix, taken of floodMassLeases, the last granted
// before last; err is the first refusal.
type massLeases struct {
	prefix string
	taken  int
	last   time.Time
	err    error
}

// takeMassLeases takes floodMassLeases leases of the minimum TTL on fresh resources, 32 at a time, and
// abandons them.
func (r *run) takeMassLeases(ctx context.Context, addr string, tlsConf *tls.Config) massLeases {
	m := massLeases{prefix: fmt.Sprintf("flood/mass/%d/", r.floods)}
	conn, err := floodDial(addr, tlsConf)
	if err != nil {
		m.err = err
		return m
	}
	defer conn.Close()
	lc := leasepb.NewLeasesClient(conn)
	var mu sync.Mutex
	var wg sync.WaitGroup
	next := make(chan int)
	for range 32 {
		wg.Go(func() {
			for k := range next {
				actx, cancel := context.WithTimeout(ctx, 3*time.Second)
				_, err := lc.Acquire(actx, &leasepb.AcquireRequest{Resource: fmt.Sprintf("%s%04d", m.prefix, k), Holder: "flood-mass", TtlMs: r.minTTL.Milliseconds()})
				cancel()
				mu.Lock()
				if err == nil {
					m.taken, m.last = m.taken+1, time.Now()
				} else if m.err == nil {
					m.err = err
				}
				mu.Unlock()
			}
		})
	}
	for k := range floodMassLeases {
		select {
		case next <- k:
		case <-ctx.Done():
		}
	}
	close(next)
	wg.Wait()
	return m
}

// awaitMassExpiry waits until none of the mass expiry's leases is left, within its bound, and returns
// how long after the last grant that was, or what went wrong: one still there, or the leases not taken.
func (r *run) awaitMassExpiry(ctx context.Context, addr string, tlsConf *tls.Config, m massLeases) (time.Duration, string) {
	if m.taken < floodMassLeases {
		return 0, fmt.Sprintf("mass expiry: took %d of %d leases (first refusal: %v)", m.taken, floodMassLeases, m.err)
	}
	conn, err := floodDial(addr, tlsConf)
	if err != nil {
		return 0, "mass expiry: " + err.Error()
	}
	defer conn.Close()
	lc := leasepb.NewLeasesClient(conn)
	bound := r.minTTL + time.Duration(floodMassLeases)*time.Second/floodExpiryRate + floodMassSlack
	deadline := m.last.Add(bound)
	for {
		lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		list, err := lc.List(lctx, &leasepb.ListRequest{Prefix: m.prefix, Limit: 1})
		cancel()
		if err == nil && len(list.GetLeases()) == 0 {
			return time.Since(m.last), ""
		}
		if time.Now().After(deadline) {
			return time.Since(m.last), fmt.Sprintf("mass expiry: leases under %s still live %v after the last was granted (bound: TTL %v + %d leases at %d/s + %v; last List error: %v)",
				m.prefix, time.Since(m.last).Round(time.Millisecond), r.minTTL, floodMassLeases, floodExpiryRate, floodMassSlack, err)
		}
		select {
		case <-ctx.Done():
			return 0, ""
		case <-time.After(100 * time.Millisecond): // poll interval
		}
	}
}

// checkFloodOutcome records a finding unless exactly limit requests were served and the excess refused.
func (r *run) checkFloodOutcome(kind, flag string, limit int, o floodOutcome) {
	if o.open != limit || o.refused != floodExcess || len(o.other) > 0 {
		r.floodFinding(fmt.Sprintf("flood of %d %s requests on one %s: %v; want %d served and %d refused naming %s",
			limit+floodExcess, kind, map[string]string{"watch": "connection", "wait": "resource"}[kind], o, limit, floodExcess, flag))
	}
}

func (r *run) floodFinding(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.floodFindings = append(r.floodFindings, s)
}

// floodDial opens a connection of its own to addr (a flood's streams count against it alone).
func floodDial(addr string, tlsConf *tls.Config) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if tlsConf != nil {
		creds = credentials.NewTLS(tlsConf)
	}
	return grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
}

// floodWatch opens limit+excess Watch streams on one connection, on a prefix nothing is written to,
// and reports, after hold, how many are still open and how the others ended.
func floodWatch(ctx context.Context, addr string, tlsConf *tls.Config, hold time.Duration) floodOutcome {
	conn, err := floodDial(addr, tlsConf)
	if err != nil {
		return floodOutcome{other: map[string]int{"dial: " + err.Error(): 1}}
	}
	defer conn.Close()
	lc := leasepb.NewLeasesClient(conn)
	return flood(ctx, floodWatchersPerConn+floodExcess, hold, "--max-watchers-per-conn", func(ctx context.Context, _ int) error {
		st, err := lc.Watch(ctx, &leasepb.WatchRequest{Prefix: "flood/none/"})
		for err == nil {
			_, err = st.Recv()
		}
		return err
	})
}

// floodWait holds a resource and queues limit+excess blocking acquires of it, each a holder of its
// own, on one connection; after hold it reports how many are still queued. The resource is left to
// expire (a release would be an event no workload operation explains, for the log checker).
func (r *run) floodWait(ctx context.Context, addr string, tlsConf *tls.Config, hold time.Duration) floodOutcome {
	conn, err := floodDial(addr, tlsConf)
	if err != nil {
		return floodOutcome{other: map[string]int{"dial: " + err.Error(): 1}}
	}
	defer conn.Close()
	lc := leasepb.NewLeasesClient(conn)
	res := fmt.Sprintf("flood/held/%d", r.floods)
	ttl := (hold + 10*time.Second).Milliseconds() // outlives the flood: no waiter is ever granted
	actx, cancel := context.WithTimeout(ctx, 3*time.Second)
	_, err = lc.Acquire(actx, &leasepb.AcquireRequest{Resource: res, Holder: "flood-owner", TtlMs: ttl})
	cancel()
	if err != nil {
		return floodOutcome{other: map[string]int{"hold: " + err.Error(): 1}}
	}
	return flood(ctx, floodWaitersPerResource+floodExcess, hold, "--max-waiters-per-resource", func(ctx context.Context, k int) error {
		_, err := lc.Acquire(ctx, &leasepb.AcquireRequest{Resource: res, Holder: fmt.Sprintf("flood-w%d", k),
			TtlMs: r.minTTL.Milliseconds(), Wait: true})
		if err == nil {
			err = errors.New("granted") // cannot happen while flood-owner holds it
		}
		return err
	})
}

// flood runs total requests at once, each until it ends or hold has passed: those that ended by then
// were refused (naming flag) or answered otherwise; the rest were served. It cancels the rest and
// returns once every request has ended.
func flood(ctx context.Context, total int, hold time.Duration, flag string, request func(context.Context, int) error) floodOutcome {
	ctx, cancel := context.WithCancel(ctx)
	ends := make(chan error, total)
	var wg sync.WaitGroup
	for k := range total {
		wg.Add(1)
		go func() { defer wg.Done(); ends <- request(ctx, k) }()
	}
	o := floodOutcome{other: map[string]int{}}
	timer := time.NewTimer(hold)
	ended := 0
wait:
	for ended < total {
		select {
		case err := <-ends:
			ended++
			if limitFlag(err) == flag {
				o.refused++
			} else {
				o.other[floodAnswer(err)]++
			}
		case <-timer.C:
			break wait
		case <-ctx.Done():
			break wait
		}
	}
	timer.Stop()
	cancel()
	wg.Wait()
	o.open = total - ended
	if len(o.other) == 0 {
		o.other = nil
	}
	return o
}

// limitFlag is the QuotaFailure subject of a ResourceExhausted error ("" for any other error).
func limitFlag(err error) string {
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted {
		return ""
	}
	for _, d := range st.Details() {
		if q, ok := d.(*errdetails.QuotaFailure); ok && len(q.GetViolations()) > 0 {
			return q.GetViolations()[0].GetSubject()
		}
	}
	return ""
}

func floodAnswer(err error) string {
	if errors.Is(err, io.EOF) {
		return "stream ended"
	}
	st := status.Convert(err)
	if f := limitFlag(err); f != "" {
		return fmt.Sprintf("%v %s", st.Code(), f)
	}
	return fmt.Sprintf("%v: %s", st.Code(), st.Message())
}
