package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/leased/leased/client"
	"github.com/leased/leased/tests/internal/proc"
)

// Gray failures: a frozen leader, a black-holed client link, a stalled disk. These nemeses join the
// schedule only with runConfig.Gray (LEASED_CHAOS_GRAY=1, make chaos GRAY=1); the L1 checker (checkL1)
// measures what they cost the clients (docs/testing.md, "Gray failures").

// nemesisRec is one entry of the nemesis log (nemeses.txt): a fault, the nodes it impairs, the client
// links it black-holes, and when it began and ended (since the history began).
type nemesisRec struct {
	Name       string
	Nodes      []int
	Clients    []string
	Start, End time.Duration
	Note       string
}

// faultStart logs the start of a fault (and counts it); faultEnd its end.
func (r *run) faultStart(name string, nodes ...int) int {
	r.stats.fault(name)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nemLog = append(r.nemLog, nemesisRec{Name: name, Nodes: nodes, Start: time.Duration(r.hist.now()), End: -1})
	return len(r.nemLog) - 1
}

func (r *run) faultEnd(id int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nemLog[id].End = time.Duration(r.hist.now())
}

func (r *run) faultNote(id int, clients []string, note string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nemLog[id].Clients = clients
	r.nemLog[id].Note = note
}

// grayNemesis injects one gray failure on the leader ld: freeze it (SIGSTOP, SIGCONT 3–12 s later),
// black-hole some clients' links to it (3–10 s), or stall its disk (1–4 s, through the faultinject
// build's admin hook).
func (r *run) grayNemesis(ctx context.Context, rng *rand.Rand, ld int) {
	if ld < 0 {
		return
	}
	kinds := []string{"freeze-leader", "blackhole-client-leader", "disk-stall-leader"}
	kind := kinds[rng.IntN(len(kinds))]
	if r.cfg.Schedule == "freeze" {
		kind = "freeze-leader"
	}
	switch kind {
	case "freeze-leader":
		d := 3*time.Second + time.Duration(rng.IntN(9000))*time.Millisecond
		id := r.faultStart(kind, ld)
		r.c.pause(ld)
		sleepCtx(ctx, d)
		r.c.resume(ld)
		r.faultEnd(id)
	case "blackhole-client-leader":
		d := 3*time.Second + time.Duration(rng.IntN(7000))*time.Millisecond
		var cls []string
		for i, name := range r.grayClients() {
			if i == 0 || rng.IntN(2) == 0 { // always one L1 holder, and about half the others
				cls = append(cls, name)
			}
		}
		id := r.faultStart(kind) // no node is impaired: only these clients' links to it
		r.faultNote(id, cls, fmt.Sprintf("links to n%d", ld+1))
		r.cnet.blackhole(ld, cls...)
		sleepCtx(ctx, d)
		r.cnet.heal()
		r.faultEnd(id)
	case "disk-stall-leader":
		d := time.Second + time.Duration(rng.IntN(3000))*time.Millisecond
		r.diskStall(ctx, ld, d)
	}
}

// grayClients are the clients a black hole may take: the L1 holders first, then the workers.
func (r *run) grayClients() []string {
	var names []string
	for k := range r.cfg.L1Holders {
		names = append(names, fmt.Sprintf("l1h%d", k))
	}
	for i := range r.cfg.Workers {
		names = append(names, fmt.Sprintf("w%d", i))
	}
	return names
}

// diskStall asks node i's admin endpoint to block its next raft log write(s) for d. Without the hook
// (a binary built without -tags faultinject, or a server that does not have it yet) the endpoint
// answers 404: the nemesis says so once and is skipped.
func (r *run) diskStall(ctx context.Context, i int, d time.Duration) {
	if r.diskHookMissing.Load() {
		r.stats.fault("disk-stall-skipped")
		return
	}
	url := fmt.Sprintf("http://%s/debug/fault/disk-stall?duration=%v", r.c.Nodes[i].AdminAddr, d)
	hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(hctx, http.MethodPost, url, nil)
	if err != nil {
		r.t.Logf("disk-stall: %v", err)
		return
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Logf("disk-stall on n%d: %v", i+1, err)
		return
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	_ = resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		if !r.diskHookMissing.Swap(true) {
			r.t.Log("disk-stall hook missing (POST /debug/fault/disk-stall answered 404): the disk-stall nemesis is skipped")
		}
		r.stats.fault("disk-stall-skipped")
		return
	default:
		r.t.Logf("disk-stall on n%d: %s: %s", i+1, resp.Status, strings.TrimSpace(string(body)))
		return
	}
	id := r.faultStart("disk-stall-leader", i)
	// The node's next write blocks for d from when it starts, so until d has passed the stall holds.
	wctx, stopWatch := context.WithTimeout(ctx, d)
	claims := r.watchStallClaims(wctx)
	stopWatch()
	r.mu.Lock()
	r.stallFindings = append(r.stallFindings, checkStallClaims(i, claims, 2*proc.ElectionTimeout)...)
	r.mu.Unlock()
	sleepCtx(ctx, 500*time.Millisecond) // the write it delayed
	if !r.c.Running(i) {                // fail-stop (decision 13): a write stalled beyond the bound
		r.faultNote(id, nil, "the node stopped")
		r.stats.fault("disk-stall-node-stopped")
		r.c.Start(i)
	}
	r.faultEnd(id)
}

// ---- the L1 holders ----

// l1Lease is one lease of an L1 holder (or of a workload worker): what it became.
type l1Lease struct {
	Holder, Resource string
	Token            uint64
	TTL              time.Duration
	Acquired, Ended  time.Duration // since the history began; Ended < 0 while held
	Reason           string        // released, lost-contact, expired, closed, held
}

// l1Acquire is one acquire of a free resource by an L1 holder: how long the grant took (retries with
// the same request id included).
type l1Acquire struct {
	Holder, Resource string
	Start, Took      time.Duration
	OK               bool
}

// endReason names why a lease ended, from the SDK's Err.
func endReason(err error) string {
	switch {
	case err == nil:
		return "held"
	case errors.Is(err, client.ErrReleased):
		return "released"
	case errors.Is(err, client.ErrLostContact):
		return "lost-contact"
	case errors.Is(err, client.ErrExpired):
		return "expired"
	case errors.Is(err, client.ErrClosed):
		return "closed"
	}
	return err.Error()
}

func lostReason(reason string) bool { return reason == "lost-contact" || reason == "expired" }

// l1AcquireBudget bounds one L1 acquire, retries included: well beyond the L1 bound (election timeout +
// 2 s), so that the stall it measures is the real one.
const l1AcquireBudget = 8 * time.Second

// l1Holder keeps leases on its own resources (free by construction), half of the holders at the TTL
// floor: it acquires one, holds it 3–9 s checking it every 50 ms, releases it, and starts again. Every
// acquire and every end of a lease is recorded for checkL1.
func (r *run) l1Holder(ctx context.Context, k int) {
	defer r.wg.Done()
	rng := rand.New(rand.NewPCG(r.cfg.Seed, 20000+uint64(k)))
	name := fmt.Sprintf("l1h%d", k)
	ttl := max(leaseTTL, r.minTTL) // the workload's TTL, unless the floor is above it
	if k%2 == 0 {
		ttl = r.minTTL
	}
	if r.cfg.Plants.has(plantGraySDK) {
		r.legacyHolder(ctx, k, name, ttl, rng)
		return
	}
	cl := r.newClient(name, nil)
	defer func() { _ = cl.Close() }()
	for n := 0; n < r.cfg.OpsPerWorker && ctx.Err() == nil; n++ {
		res := fmt.Sprintf("l1/%d/%d", k, n)
		reqID := fmt.Sprintf("%s-%d", name, n)
		start := r.hist.now()
		var l *client.Lease
		for attempt := 0; l == nil && ctx.Err() == nil; attempt++ {
			left := l1AcquireBudget - time.Duration(r.hist.now()-start)
			if left <= 0 {
				break
			}
			call := r.hist.now()
			actx, cancel := context.WithTimeout(ctx, min(left, 3*time.Second))
			got, err := cl.Acquire(actx, res, client.WithTTL(ttl), client.WithRequestID(reqID))
			cancel()
			out := opOutput{Out: classify(err)}
			if err == nil {
				l, out.Holder, out.Token = got, got.Holder(), got.Token()
			}
			r.hist.add(op{Client: 3000 + k, In: opInput{Kind: opAcquire, Resource: res, Holder: name, ReqID: reqID},
				Out: out, Call: call, Return: r.hist.now(), Attempt: attempt})
			r.stats.op(opAcquire, out.Out)
			if out.Out != outUnknown {
				break
			}
		}
		if ctx.Err() != nil && l == nil {
			return // the run ended: not a measurement
		}
		r.addL1Acquire(l1Acquire{Holder: name, Resource: res, Start: time.Duration(start), Took: time.Duration(r.hist.now() - start), OK: l != nil})
		if l == nil {
			sleepCtx(ctx, 200*time.Millisecond)
			continue
		}
		rec := l1Lease{Holder: name, Resource: res, Token: l.Token(), TTL: ttl, Acquired: time.Duration(r.hist.now()), Ended: -1}
		until := time.Now().Add(3*time.Second + time.Duration(rng.IntN(6000))*time.Millisecond)
		for time.Now().Before(until) && ctx.Err() == nil && l.Err() == nil {
			sleepCtx(ctx, 50*time.Millisecond) // the holder's own pace
		}
		if err := l.Err(); err != nil {
			rec.Reason, rec.Ended = endReason(err), time.Duration(r.hist.now())
		} else if ctx.Err() == nil {
			r.release(ctx, 3000+k, res, l.Token(), l.Release)
			rec.Reason, rec.Ended = "released", time.Duration(r.hist.now())
		} else {
			rec.Reason = "held"
		}
		r.addL1Lease(rec)
		sleepCtx(ctx, time.Duration(100+rng.IntN(400))*time.Millisecond)
	}
}

func (r *run) addL1Acquire(a l1Acquire) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.l1Acqs = append(r.l1Acqs, a)
}

func (r *run) addL1Lease(l l1Lease) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.l1Leases = append(r.l1Leases, l)
}

// ---- the TTL floor ----

var ttlRange = regexp.MustCompile(`(?:below the minimum |outside )(\d+)`)

// discoverMinTTL asks the cluster for its TTL floor: an acquire with a 1 ms TTL is refused with the
// range the node accepts ("ttl_ms: 1 is outside 1000..3600000"). If the answer cannot be read, the
// server's default (--min-ttl, which the harness does not set) is assumed.
func (r *run) discoverMinTTL() time.Duration {
	const fallback = time.Second
	cl := r.newClient("ttl-probe", nil)
	defer func() { _ = cl.Close() }()
	for range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		l, err := cl.Acquire(ctx, "zz/ttl-probe", client.WithTTL(time.Millisecond))
		cancel()
		if err == nil {
			_ = l.Release(context.Background())
			return time.Millisecond
		}
		if m := ttlRange.FindStringSubmatch(err.Error()); m != nil {
			ms, _ := strconv.Atoi(m[1])
			return time.Duration(ms) * time.Millisecond
		}
		if errors.Is(err, client.ErrInvalid) {
			break
		}
		time.Sleep(100 * time.Millisecond) // the cluster is settling: pace the retries
	}
	r.t.Logf("TTL floor not readable from the cluster: assuming %v", fallback)
	return fallback
}

// ---- planted bugs in the workload client ----

// plants switches on planted bugs of the harness's workload client (runConfig.Plants, or
// LEASED_CHAOS_PLANT=comma,separated,names), to show that the checkers catch SDK defects under gray
// failures, which the SDK itself no longer has:
//
//   - gray-sdk: the L1 holders use a legacy client (legacyHolder) that keeps one KeepAlive stream on the
//     node it started with and never gives up on it while it stays open (no watchdog on answers), and
//     gives the first attempt of an acquire the whole deadline, on the leader it last knew. L1 must
//     report leases lost and acquires stalled under a frozen leader.
//   - release-lost-answer: every release of a held lease by a worker discards the first answer (as if
//     it had been lost), retries, and reports the retry's NOT_FOUND. The log checker must report it;
//     porcupine cannot (its model lets a lease expire at any moment).
type plants []string

const (
	plantGraySDK      = "gray-sdk"
	plantReleaseRetry = "release-lost-answer"
)

func (p plants) has(name string) bool { return slices.Contains(p, name) }

func plantsFromEnv() plants {
	var p plants
	for _, s := range strings.Split(os.Getenv("LEASED_CHAOS_PLANT"), ",") {
		if s = strings.TrimSpace(s); s != "" {
			p = append(p, s)
		}
	}
	return p
}

// electionBound is L1's bound on an acquire of a free resource: the election timeout plus 2 s.
const electionBound = proc.ElectionTimeout + 2*time.Second
