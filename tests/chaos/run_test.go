package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/client"
	"github.com/leased/leased/tests/internal/proc"
)

// runConfig bounds one chaos run. Every loop of the run is bounded by Duration and by OpsPerWorker.
type runConfig struct {
	Seed         uint64
	Nodes        int           // cluster size: 3, or 5 with LEASED_CHAOS_NODES=5
	Duration     time.Duration // of the workload under faults
	Workers      int
	Durable      int // long-TTL workers (I3)
	Hot, Cold    int // resources per epoch
	Epoch        time.Duration
	OpsPerWorker int
	Nemeses      bool
	FullRestart  bool
	CheckTimeout time.Duration // porcupine
	Bin          string

	// Gray adds the gray-failure nemeses (freeze the leader, black-hole clients' links to it, stall its
	// disk) to the schedule: LEASED_CHAOS_GRAY=1, make chaos GRAY=1.
	Gray bool
	// Schedule "freeze" runs only the freeze-leader nemesis (the gray-sdk planted-bug test).
	Schedule string
	// L1Holders keep leases on their own resources, half at the TTL floor, for the L1 checker.
	L1Holders int
	// Semaphore workers take slots of semaphore resources, for the "at most N" checker (semaphore_test.go).
	Semaphore int
	// Strict counts the violations of the SDK's gray-failure checks as failures (LEASED_CHAOS_STRICT=1,
	// make chaos STRICT=1): L1 and log-release. Otherwise they are reported only (strictOnly).
	Strict bool
	// Plants are planted bugs of the workload client (plants; LEASED_CHAOS_PLANT).
	Plants plants
	// TLS runs the cluster with TLS on the client and peer ports (tls_test.go; LEASED_CHAOS_TLS=1, make
	// chaos TLS=1).
	TLS bool
	// Membership adds the membership nemesis (replace a follower: remove, wipe, add fresh, promote) to the
	// schedule: LEASED_CHAOS_MEMBERSHIP=1 (membership_test.go).
	Membership bool
	// Wipe adds the wipe nemesis (a lost volume, restarted with --auto-rejoin): LEASED_CHAOS_WIPE=1 (wipe_test.go).
	Wipe bool
	// BatchGroups are groups of workers that share one client and write at the same instants, so that
	// the SDK batches their writes (batch_test.go).
	BatchGroups int
	// Flood adds the flood nemesis (a hostile client past the per-connection and per-resource limits) and
	// its "limits" checker: LEASED_CHAOS_FLOOD=1 (flood_test.go).
	Flood bool
	// PeerForge adds the peer-forge nemesis (forged raft messages to a peer port): LEASED_CHAOS_PEERFORGE=1.
	PeerForge bool
	// DiskDamage adds the disk-damage nemesis (a byte flipped in a stopped node's WAL, raft.db or ack file) and its
	// "disk" findings: LEASED_CHAOS_DISK=1 (diskdamage_test.go).
	DiskDamage bool
	DiskErr    bool // the stalled-follower-disk and full-disk nemeses: LEASED_CHAOS_DISKERR=1 (diskerr_test.go)
	// LogLevel, if set, is the nodes' --log-level instead of info: LEASED_CHAOS_LOG_LEVEL=debug (make
	// chaos LOG_LEVEL=debug) puts raft's own account of elections and probes in the node logs.
	LogLevel string
}

// run is one chaos run: a cluster, the workload, the nemeses, and what they recorded.
type run struct {
	t     testing.TB
	cfg   runConfig
	c     *cluster
	dir   string
	hist  *history
	stats *counters
	wg    sync.WaitGroup

	stores *stores

	mu             sync.Mutex
	beliefs        []*belief
	durable        []durableRecord
	durableHeld    []*client.Lease
	durableClients []*client.Client
	releases       map[releaseKey]time.Time
	events         []event
	semEvents      []event // events of semaphore slots, checked by checkSemaphores
	gaps           []uint64
	// watchRedelivered counts events a Watch stream delivered below the index it was asked to start from.
	watchRedelivered int

	// removed are the node indexes the membership nemesis removed and has not added back yet (nemesis
	// goroutine only).
	removed map[int]bool

	// monitor
	leaderChanges int
	maxUnavail    time.Duration

	// clientLog receives every SDK client's debug log (clients.log in the artifacts), with times as
	// offsets from the start of the run like the nemesis log's.
	clientLog *slog.Logger

	// gray failures and L1
	cnet            *clientNet
	minTTL          time.Duration
	nemLog          []nemesisRec
	l1Acqs          []l1Acquire
	l1Leases        []l1Lease
	workEnd         time.Duration
	diskHookMissing atomic.Bool
	// stallFindings: a disk-stalled leader that still named itself the leader (checkStallClaims).
	stallFindings []string

	// shutdownFindings: a node that did not exit within stopBound of its SIGTERM (the stop nemesis).
	shutdownFindings []string
	// diskFindings: a damaged node that neither refused (naming the file) nor served (diskdamage_test.go).
	diskFindings []string

	// the flood nemesis: floods begun (nemesis goroutine only), and what the limits checker found
	floods        int
	floodFindings []string
	// peerForgeFindings: what the peer-forge checker found (peerforge_test.go).
	peerForgeFindings []string

	// outcomeFindings: Acquire calls whose unknown outcome did not name their request id (checkOutcomeID).
	outcomeFindings []string
	outcomeChecked  int
}

// report is the outcome of a run: the summary figures and the violations per invariant.
type report struct {
	Seed          uint64
	Elapsed       time.Duration
	Ops           map[string]int
	Faults        map[string]int
	LeaderChanges int
	MaxUnavail    time.Duration
	Violations    map[string][]string // invariant -> violations
	Lin           linearizability
	Fenced, Plain fenceReport
	FenceRejected int
	LooseOverlaps int
	Events        int
	SemEvents     int
	WatchGaps     int
	WatchRedeliv  int
	Durable       int
	MinTTL        time.Duration
	L1            l1Report
	Strict        bool
	AnswersLog    int // answers checked against the applied event log
	OutcomeIDs    int // acquires ended ErrOutcomeUnknown whose named request id was checked
}

// strictOnly are the checks that fail a run only with Strict; every run reports them. They judge the SDK
// against gray failures (docs/testing.md, "Gray failures").
var strictOnly = map[string]bool{"L1": true, "log-release": true}

// total counts the violations that fail a run: every invariant's, and strictOnly's only when Strict.
func (rep *report) total() int {
	n := 0
	for inv, v := range rep.Violations {
		if strictOnly[inv] && !rep.Strict {
			continue
		}
		n += len(v)
	}
	return n
}

func (rep *report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "chaos summary (seed %d, reproduce: make chaos SEED=%d DURATION=…)\n", rep.Seed, rep.Seed)
	fmt.Fprintf(&b, "  elapsed %v\n", rep.Elapsed.Round(time.Millisecond))
	fmt.Fprintf(&b, "  operations by outcome: %s\n", sortedMap(rep.Ops))
	fmt.Fprintf(&b, "  faults injected: %s\n", sortedMap(rep.Faults))
	fmt.Fprintf(&b, "  leader changes: %d; max unavailability window: %v\n", rep.LeaderChanges, rep.MaxUnavail.Round(time.Millisecond))
	fmt.Fprintf(&b, "  porcupine: %s over %d operations in %v\n", rep.Lin.Result, rep.Lin.Ops, rep.Lin.Elapsed.Round(time.Millisecond))
	fmt.Fprintf(&b, "  applied events checked: %d (watch gaps: %d, events re-delivered below from_index: %d); durable leases checked after full restart: %d\n",
		rep.Events, rep.WatchGaps, rep.WatchRedeliv, rep.Durable)
	fmt.Fprintf(&b, "  fence ON : %d writes accepted, %d stale writes rejected, %d stale accepted, %d lost updates\n",
		rep.Fenced.Accepted, rep.FenceRejected, rep.Fenced.StaleAccepted, rep.Fenced.LostUpdates)
	fmt.Fprintf(&b, "  fence OFF: %d writes accepted, %d stale accepted, %d lost updates\n",
		rep.Plain.Accepted, rep.Plain.StaleAccepted, rep.Plain.LostUpdates)
	fmt.Fprintf(&b, "  I4 loose overlaps (Done seen after a later grant returned, incl. scheduling delay): %d\n", rep.LooseOverlaps)
	fmt.Fprintf(&b, "  answers checked against the applied event log: %d\n", rep.AnswersLog)
	fmt.Fprintf(&b, "  acquires of unknown outcome checked for their request id: %d\n", rep.OutcomeIDs)
	fmt.Fprintf(&b, "  semaphore slot events checked (at most %d live per resource): %d\n", semLimit, rep.SemEvents)
	fmt.Fprintf(&b, "  L1 (TTL floor %v; acquire bound %v):\n", rep.MinTTL, electionBound)
	b.WriteString(rep.L1.String())
	for _, inv := range []string{"I1/I2", "I3", "I4", "I5", "I6", "log", "log-release", "obs", "L1", "sem", "limits", "outcome-id", "stall", "shutdown", "disk", "peer-forge"} {
		note := ""
		if strictOnly[inv] && !rep.Strict {
			note = " (reported only; LEASED_CHAOS_STRICT=1 enforces it)"
		}
		fmt.Fprintf(&b, "  violations %-11s: %d%s\n", inv, len(rep.Violations[inv]), note)
	}
	return b.String()
}

// writeViolations writes every violation, by invariant, to path.
func writeViolations(vs map[string][]string, path string) {
	var b strings.Builder
	for _, inv := range slices.Sorted(maps.Keys(vs)) {
		for _, v := range vs[inv] {
			fmt.Fprintf(&b, "%s\t%s\n", inv, v)
		}
	}
	_ = os.WriteFile(path, []byte(b.String()), 0o644)
}

// openClientLog points clientLog at path; the function it returns closes the file.
func (r *run) openClientLog(path string, start time.Time) func() {
	f, err := os.Create(path)
	if err != nil {
		r.t.Fatal(err)
	}
	r.clientLog = slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{
		Level: slog.LevelDebug,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey && len(groups) == 0 {
				return slog.String("t", fmt.Sprintf("%.3f", a.Value.Time().Sub(start).Seconds()))
			}
			return a
		},
	}))
	return func() { _ = f.Close() }
}

func sortedMap(m map[string]int) string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}

// chaosRun starts a cluster, runs the workload (with nemeses if configured), heals, and checks every
// invariant. It returns the report; the caller decides what is a failure.
func chaosRun(t testing.TB, cfg runConfig, dir string) *report {
	t.Logf("chaos run: seed %d, duration %v, nemeses %v, tls %v, artifacts in %s", cfg.Seed, cfg.Duration, cfg.Nemeses, cfg.TLS, dir)
	start := time.Now()
	r := &run{
		t: t, cfg: cfg, dir: dir, hist: newHistory(), stores: newStores(t),
		stats:    &counters{ops: map[string]int{}, faults: map[string]int{}},
		releases: map[releaseKey]time.Time{},
	}
	r.c = newCluster(t, cfg.Bin, filepath.Join(dir, "cluster"), max(cfg.Nodes, 3), cfg.TLS, cfg.LogLevel)
	hist := newHistory() // the run's, once the floor is known (discovering it is not part of the history)
	closeLog := r.openClientLog(filepath.Join(dir, "clients.log"), hist.start)
	defer closeLog()
	r.cnet = newClientNet(r.c.Endpoints())
	r.minTTL = r.discoverMinTTL()
	r.hist = hist

	bg, stopBg := context.WithCancel(context.Background())
	var bgWG sync.WaitGroup
	watchCl := r.newClient("watcher", nil)
	defer watchCl.Close()
	bgWG.Add(2)
	go func() { defer bgWG.Done(); r.watch(bg, watchCl) }()
	go func() { defer bgWG.Done(); r.monitor(bg) }()

	work, stopWork := context.WithTimeout(context.Background(), cfg.Duration)
	for i := range cfg.Workers {
		r.wg.Add(1)
		go r.worker(work, i)
	}
	for g := range cfg.BatchGroups {
		r.wg.Add(1)
		go r.batchGroup(work, g)
	}
	for k := range cfg.Durable {
		r.wg.Add(1)
		go r.durableWorker(work, k)
	}
	for k := range cfg.L1Holders {
		r.wg.Add(1)
		go r.l1Holder(work, k)
	}
	for k := range cfg.Semaphore {
		r.wg.Add(1)
		go r.semaphoreWorker(work, k)
	}
	var nemWG sync.WaitGroup
	if cfg.Nemeses || cfg.Schedule != "" {
		nemWG.Add(1)
		go func() { defer nemWG.Done(); r.nemesis(work) }()
	}
	<-work.Done()
	r.mu.Lock()
	r.workEnd = time.Duration(r.hist.now())
	r.mu.Unlock()
	nemWG.Wait()
	stopWork()
	r.wg.Wait()

	// Heal everything and let the cluster settle.
	r.c.healAll()
	if _, _, err := r.c.WaitLeader(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	rep := &report{Seed: cfg.Seed, Violations: map[string][]string{}}
	violate := func(inv string, v ...string) { rep.Violations[inv] = append(rep.Violations[inv], v...) }

	// Every node's state at one applied index; then a sentinel grant (a later index) whose event proves the
	// watcher has received every event up to that index.
	states, statesErr := r.c.sameStates(30 * time.Second)
	// Make sure the watcher has seen everything applied so far: a sentinel grant, then wait for its event.
	sentCl := r.newClient("sentinel", nil)
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	sl, err := sentCl.Acquire(sctx, "zz/sentinel", client.WithTTL(leaseTTL))
	cancel()
	if err != nil {
		t.Fatalf("sentinel acquire: %v", err)
	}
	if err := proc.Poll(20*time.Second, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.events) > 0 && r.events[len(r.events)-1].Index >= sl.Token()
	}); err != nil {
		t.Fatalf("watcher did not see the sentinel grant: %v", err)
	}
	sentinelTok := sl.Token()
	r.sentRelease(sl.Resource(), sl.Token())
	_ = sl.Release(context.Background())
	_ = sentCl.Close()
	stopBg()
	bgWG.Wait()

	// I1/I2: the applied event stream, and every node's state at one applied index.
	r.mu.Lock()
	events, gaps, releases := slices.Clone(r.events), slices.Clone(r.gaps), r.releases
	semEvents := slices.Clone(r.semEvents)
	rep.Events, rep.WatchGaps, rep.WatchRedeliv, rep.SemEvents = len(events), len(gaps), r.watchRedelivered, len(semEvents)
	r.mu.Unlock()
	if f, err := os.Create(filepath.Join(dir, "events.txt")); err == nil {
		for _, e := range events {
			fmt.Fprintf(f, "%d %v %s %s %d %s\n", e.Index, e.Type, e.Resource, e.Holder, e.Token, e.Seen.Format("15:04:05.000000"))
		}
		_ = f.Close()
	}
	if rep.WatchRedeliv > 0 {
		// Fixed in server/internal/watch: a watcher must never see an event below the index it started from.
		violate("I1/I2", fmt.Sprintf("%d watch events re-delivered below their from_index", rep.WatchRedeliv))
	}
	violate("I1/I2", checkGrants(events, releases, gaps)...)
	if statesErr != nil {
		violate("I1/I2", "nodes never reached the same applied index: "+statesErr.Error())
	} else {
		violate("I1/I2", checkStates(states, events, len(gaps) == 0)...)
		violate("sem", checkSemaphoreStates(states)...)
	}
	violate("sem", checkSemaphores(semEvents, gaps)...)

	// I3: acknowledged long-TTL grants and releases survive a full-cluster restart.
	r.mu.Lock()
	recs := slices.Clone(r.durable)
	for _, l := range r.durableHeld {
		recs = append(recs, durableRecord{Resource: l.Resource(), Token: l.Token(), Unsure: l.Err() != nil})
	}
	r.mu.Unlock()
	if cfg.FullRestart {
		for i := range r.c.Nodes {
			r.c.Kill(i)
		}
		r.stats.fault("full-restart")
		for i := range r.c.Nodes {
			r.c.Start(i)
		}
		if _, _, err := r.c.WaitLeader(20 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	after := map[string]uint64{}
	for _, rec := range recs {
		var resp *leasepb.GetResponse
		err := proc.Poll(10*time.Second, func() bool {
			ld, _ := r.c.Leader(context.Background())
			if ld < 0 {
				return false
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			var err error
			resp, err = r.c.Leases(ld).Get(ctx, &leasepb.GetRequest{Resource: rec.Resource})
			if err != nil && strings.Contains(err.Error(), "NotFound") {
				resp, err = &leasepb.GetResponse{}, nil
			}
			return err == nil
		})
		if err != nil {
			violate("I3", fmt.Sprintf("cannot read %s after the restart: %v", rec.Resource, err))
			continue
		}
		if resp.GetLease() != nil {
			after[rec.Resource] = resp.GetLease().GetToken()
		}
	}
	rep.Durable = len(recs)
	violate("I3", checkDurable(recs, after)...)
	if cfg.FullRestart {
		if states, err := r.c.sameStates(30 * time.Second); err != nil {
			violate("I1/I2", "after the restart, nodes never reached the same applied index: "+err.Error())
		} else {
			violate("I1/I2", checkStates(states, nil, false)...)
		}
	}
	r.mu.Lock()
	for _, cl := range r.durableClients {
		_ = cl.Close()
	}
	r.mu.Unlock()
	r.wg.Wait() // the Done watchers of the durable leases

	// I6: porcupine.
	ops := r.hist.snapshot()
	if err := writeHistory(ops, filepath.Join(dir, "history.jsonl")); err != nil {
		t.Log(err)
	}
	rep.Lin = checkLinearizable(ops, dir, cfg.CheckTimeout)

	// Every definite answer against the applied event log.
	var vlog, vrel []string
	rep.AnswersLog, vlog, vrel = checkAnswers(ops, events, r.hist.start, gaps, sentinelTok)
	violate("log", vlog...)
	violate("log-release", vrel...)

	// The audit trail and the leader gauges.
	violate("obs", r.checkObservability(events)...)

	// The limits held against the flood nemesis, every unknown acquire named its request id, and no
	// disk-stalled leader kept naming itself the leader.
	r.mu.Lock()
	violate("limits", r.floodFindings...)
	violate("peer-forge", r.peerForgeFindings...)
	violate("outcome-id", r.outcomeFindings...)
	violate("stall", r.stallFindings...)
	violate("shutdown", r.shutdownFindings...)
	violate("disk", r.diskFindings...)
	rep.OutcomeIDs = r.outcomeChecked
	r.mu.Unlock()

	// L1, from the nemesis log.
	r.mu.Lock()
	nems, acqs, l1s, workEnd := slices.Clone(r.nemLog), slices.Clone(r.l1Acqs), slices.Clone(r.l1Leases), r.workEnd
	for _, b := range r.beliefs {
		if b.Holder != "" && b.EndReason != "" {
			l1s = append(l1s, l1Lease{Holder: b.Holder, Resource: b.Resource, Token: b.Token, TTL: leaseTTL,
				Acquired: b.Acquired.Sub(r.hist.start), Ended: b.DoneSeen.Sub(r.hist.start), Reason: b.EndReason})
		}
	}
	r.mu.Unlock()
	writeNemesisLog(nems, filepath.Join(dir, "nemeses.txt"))
	var v1 []string
	rep.L1, v1 = checkL1(len(r.c.Nodes), r.minTTL, workEnd, nems, l1s, acqs, ops)
	violate("L1", v1...)
	rep.MinTTL, rep.Strict = r.minTTL, cfg.Strict
	switch rep.Lin.Result {
	case porcupine.Illegal:
		violate("I6", fmt.Sprintf("history not linearizable (%d resources: %s); visualisation: %s; details: LEASED_CHAOS_RECHECK=%s go test -run TestRecheckHistory ./tests/chaos/",
			rep.Lin.Failures, strings.Join(rep.Lin.Resources, ", "), rep.Lin.Visual, dir))
	case porcupine.Unknown:
		violate("I6", fmt.Sprintf("porcupine inconclusive within %v; visualisation: %s", cfg.CheckTimeout, rep.Lin.Visual))
	}

	// I4 and I5.
	r.mu.Lock()
	var bs []belief
	for _, b := range r.beliefs {
		bs = append(bs, *b)
	}
	r.mu.Unlock()
	v4, loose := checkBeliefs(bs)
	violate("I4", v4...)
	rep.LooseOverlaps = loose
	fencedFinal, plainFinal := r.stores.finals()
	r.stores.mu.Lock()
	fencedLog, plainLog, rejected := slices.Clone(r.stores.fencedLog), slices.Clone(r.stores.plainLog), r.stores.rejected
	r.stores.mu.Unlock()
	var v5 []string
	rep.Fenced, v5 = checkFence(fencedLog, fencedFinal)
	violate("I5", v5...)
	rep.Plain, _ = checkFence(plainLog, plainFinal) // the contrast: expected to be violated under pauses
	rep.FenceRejected = rejected
	if pg := r.stores.pg; pg != nil {
		// I5 again, on a store in another process with its own transactions.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		pgLog, pgFinal, err := pg.log(ctx)
		cancel()
		if err != nil {
			violate("I5", "postgres: reading the accepted writes: "+err.Error())
		}
		_, v := checkFence(pgLog, pgFinal)
		for _, x := range v {
			violate("I5", "postgres: "+x)
		}
		r.stores.mu.Lock()
		t.Logf("postgres fence: %d writes accepted, %d stale writes rejected, %d I5 violations", len(pgLog), r.stores.pgRejected, len(v))
		r.stores.mu.Unlock()
	}

	r.stats.mu.Lock()
	rep.Ops, rep.Faults = r.stats.ops, r.stats.faults
	r.stats.mu.Unlock()
	rep.LeaderChanges, rep.MaxUnavail = r.leaderChanges, r.maxUnavail
	rep.Elapsed = time.Since(start)
	summary := rep.String()
	_ = os.WriteFile(filepath.Join(dir, "summary.txt"), []byte(summary), 0o644)
	writeViolations(rep.Violations, filepath.Join(dir, "violations.txt")) // all of them; the test log shows 20 a kind
	for inv, vs := range rep.Violations {
		for i, v := range vs {
			if i == 20 {
				t.Logf("%s: ... %d more", inv, len(vs)-20)
				break
			}
			t.Logf("%s violation: %s", inv, v)
		}
	}
	return rep
}

// watch follows every applied lease event from index 1, resuming after stream failures.
func (r *run) watch(ctx context.Context, cl *client.Client) {
	from, last := uint64(1), uint64(0)
	atLast := map[string]bool{} // events already received at index last (one entry can expire many leases)
	for ctx.Err() == nil {
		err := cl.Watch(ctx, client.WatchOptions{FromIndex: from}, func(e client.Event) error {
			key := fmt.Sprint(e.Type, e.Lease.Resource, e.Lease.Token)
			r.mu.Lock()
			defer r.mu.Unlock()
			if e.Index < last || (e.Index == last && atLast[key]) {
				// Re-delivered below the index asked for: a Watch API defect, not a
				// state-machine one. Counted, and kept out of the I1/I2 stream.
				r.watchRedelivered++
				return nil
			}
			if e.Index > last {
				last, atLast = e.Index, map[string]bool{}
			}
			atLast[key] = true
			ev := event{Type: e.Type, Index: e.Index, Resource: e.Lease.Resource,
				Holder: e.Lease.Holder, Token: e.Lease.Token, Seen: time.Now(), Limit: e.Lease.Limit}
			if ev.Limit > 0 {
				r.semEvents = append(r.semEvents, ev) // a semaphore slot: not for the plain checkers
			} else {
				r.events = append(r.events, ev)
			}
			from = e.Index + 1
			return nil
		})
		var ce *client.CompactedError
		if errors.As(err, &ce) {
			r.mu.Lock()
			r.gaps = append(r.gaps, from-1)
			r.mu.Unlock()
			from = ce.OldestIndex
		}
		sleepCtx(ctx, 50*time.Millisecond) // retry pace
	}
}

// monitor polls the nodes: leader changes (distinct terms with a leader) and the longest time without a
// successful linearizable read (the unavailability window seen by a client).
func (r *run) monitor(ctx context.Context) {
	probe := r.newClient("probe", nil)
	defer probe.Close()
	terms := map[uint64]bool{}
	lastOK := time.Now()
	tk := time.NewTicker(100 * time.Millisecond)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
		}
		for i := range r.c.Nodes {
			if s, err := r.c.Status(ctx, i); err == nil && s.GetRole() == leasepb.Role_ROLE_LEADER {
				terms[s.GetTerm()] = true
			}
		}
		gctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		_, err := probe.Get(gctx, "probe")
		cancel()
		now := time.Now()
		if err == nil || errors.Is(err, client.ErrNotFound) {
			lastOK = now
		}
		r.mu.Lock()
		r.leaderChanges = max(len(terms)-1, 0)
		r.maxUnavail = max(r.maxUnavail, now.Sub(lastOK))
		r.mu.Unlock()
	}
}

// nemesis injects faults at random from the seed until ctx ends, and heals before returning. One fault
// at a time; each lasts longer than the election timeout.
func (r *run) nemesis(ctx context.Context) {
	rng := rand.New(rand.NewPCG(r.cfg.Seed, 0xfa17))
	defer r.c.healAll()
	defer r.cnet.heal()
	var pauses sync.WaitGroup
	defer pauses.Wait()
	npause, nreplace := 0, 0
	for ctx.Err() == nil {
		sleepCtx(ctx, time.Duration(300+rng.IntN(1200))*time.Millisecond)
		if ctx.Err() != nil {
			return
		}
		ld, _ := r.c.Leader(ctx)
		if r.cfg.Schedule == "freeze" || (r.cfg.Gray && rng.IntN(2) == 0) {
			r.grayNemesis(ctx, rng, ld)
			continue
		}
		if r.cfg.Flood && rng.IntN(6) == 0 {
			r.floodNemesis(ctx, rng, ld)
			continue
		}
		if r.cfg.PeerForge && rng.IntN(4) == 0 {
			r.peerForgeNemesis(ctx, rng, ld)
			continue
		}
		if r.cfg.DiskDamage && rng.IntN(4) == 0 {
			r.diskDamageNemesis(ctx, rng, ld)
			continue
		}
		if r.cfg.DiskErr && rng.IntN(4) == 0 {
			r.diskErrNemesis(ctx, rng, ld)
			continue
		}
		if r.cfg.Wipe && rng.IntN(4) == 0 {
			r.wipeNemesis(ctx, rng, ld)
			continue
		}
		if r.cfg.Membership && rng.IntN(4) == 0 {
			r.membershipNemesis(rng, ld, &nreplace)
			continue
		}
		pick := func(leader bool) int { // the leader, or a node that is not the leader
			if leader && ld >= 0 {
				return ld
			}
			i := rng.IntN(len(r.c.Nodes))
			if i == ld {
				i = (i + 1) % len(r.c.Nodes)
			}
			return i
		}
		hold := 2*proc.ElectionTimeout + time.Duration(rng.IntN(1500))*time.Millisecond
		switch k := rng.IntN(8); k {
		case 0, 1:
			leader := rng.IntN(2) == 0
			i := pick(leader)
			if rng.IntN(3) == 0 { // a clean stop: the node drains its clients' streams and hands over leadership
				id := r.faultStart(map[bool]string{true: "stop-leader", false: "stop-follower"}[leader && ld >= 0], i)
				r.stopNode(i)
				sleepCtx(ctx, hold)
				r.restartAndRejoin(ctx, i)
				r.faultEnd(id)
				continue
			}
			id := r.faultStart(map[bool]string{true: "kill-leader", false: "kill-follower"}[leader && ld >= 0], i)
			r.c.Kill(i)
			sleepCtx(ctx, hold)
			r.restartAndRejoin(ctx, i)
			r.faultEnd(id)
		case 2:
			leader := rng.IntN(3) > 0
			i := pick(leader)
			id := r.faultStart(map[bool]string{true: "pause-leader", false: "pause-follower"}[leader && ld >= 0], i)
			r.c.pause(i)
			sleepCtx(ctx, hold)
			r.c.resume(i)
			r.faultEnd(id)
		case 3, 4:
			leader := k == 3
			i := pick(leader)
			id := r.faultStart(map[bool]string{true: "partition-leader", false: "isolate-follower"}[leader], i)
			r.c.proxy.partition(i)
			sleepCtx(ctx, hold)
			r.c.proxy.heal()
			r.faultEnd(id)
		case 5:
			// one way: the leader still sends, but hears nothing (or the reverse)
			i := pick(true)
			in := rng.IntN(2) == 0
			for j := range r.c.Nodes {
				if j == i {
					continue
				}
				if in {
					r.c.proxy.cut(j, i)
				} else {
					r.c.proxy.cut(i, j)
				}
			}
			id := r.faultStart(map[bool]string{true: "one-way-leader-deaf", false: "one-way-leader-mute"}[in], i)
			sleepCtx(ctx, hold)
			r.c.proxy.heal()
			r.faultEnd(id)
		case 6:
			i := rng.IntN(len(r.c.Nodes))
			id := r.faultStart("delay-node", i)
			r.c.proxy.delay(i, time.Duration(20+rng.IntN(150))*time.Millisecond)
			sleepCtx(ctx, hold)
			r.c.proxy.heal()
			r.faultEnd(id)
		case 7:
			if npause > 0 && rng.IntN(2) == 0 {
				continue
			}
			npause++
			id := r.faultStart("holder-pause") // a client's fault: no node is impaired
			prng := rand.New(rand.NewPCG(r.cfg.Seed, 0xb0b+uint64(npause)))
			pauses.Add(1)
			go func(n int) { defer pauses.Done(); r.pausedHolder(ctx, prng, n); r.faultEnd(id) }(npause)
		}
	}
}
