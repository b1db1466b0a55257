package server_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest"
)

// The memory benchmarks (the target: at most 400 bytes of RSS per held lease per node at 1,000,000 leases,
// and a restart with 1M leases ready within 5 s). They run one in-process node: memory is per node, and a
// single node holds everything a member does (state machine, lessor, watch history, raft log, snapshots)
// while the process holds nothing else, so its RSS growth is one node's. A follower holds the same, less
// the lessor's deadline heap (8 bytes a lease). Each uses the production values of the settings that
// decide memory (snapshot and watch history sizes, checkpoint interval), not TestConfig's.
//
// Run:
//
//	go test -run '^$' -bench 'MemoryHeld' -benchtime 1x -timeout 30m ./server/
//	LEASED_BENCH_LEASES=1000000 go test -run '^$' -bench 'MemoryHeld|RestartReady' -benchtime 1x -timeout 60m ./server/
//
// LEASED_BENCH_HEAPPROFILE=path writes a heap profile of the node holding its leases (go tool pprof
// -sample_index=inuse_space -top path) for the breakdown by owner in docs/benchmarks.md.

// benchLeases is how many leases the memory benchmarks hold: LEASED_BENCH_LEASES, default def.
func benchLeases(b *testing.B, def int) int {
	v := os.Getenv("LEASED_BENCH_LEASES")
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		b.Fatalf("LEASED_BENCH_LEASES=%q: want a positive count", v)
	}
	return n
}

// productionMemory gives a benchmark node the production settings that decide its memory.
func productionMemory(n int) func(*server.Config) {
	def := server.DefaultConfig()
	return func(cfg *server.Config) {
		cfg.TickInterval = 50 * time.Millisecond
		cfg.SnapshotEntries, cfg.SnapshotCatchUp = def.SnapshotEntries, def.SnapshotCatchUp
		cfg.WatchHistory, cfg.WatchHistoryBytes = def.WatchHistory, def.WatchHistoryBytes
		cfg.CheckpointInterval = def.CheckpointInterval
		cfg.Limits.MaxLeases = n + 1000
		cfg.Limits.MaxLeasesPerHolder = n/benchHolders + 1
		cfg.Limits.QuotaBytes = 8 << 30
		// On the shared, loaded machine these run on at the lowest priority, the default 5 s proposal
		// timeout is too short for a node that just took over a million leases (its lessor scans them all).
		cfg.ProposalTimeout = time.Minute
	}
}

const benchHolders = 1000

// BenchmarkMemoryHeld grants LEASED_BENCH_LEASES (default 100,000) leases through the API (short names,
// 1,000 holders, a 16-byte request id, no value, a 10-minute TTL) and reports what holding them costs the
// node, per lease, once their entries are applied and a garbage collection ran: the live heap
// (heap-B/lease) and the process's resident memory (rss-B/lease, split into anonymous memory and mapped
// files: bbolt's mmap). The RSS is read without returning freed memory to the OS first, so it includes the
// garbage collector's headroom, as a running node's does. gc-cpu-% is the collector's share of the CPU
// used while granting, which a tight GOMEMLIMIT raises.
func BenchmarkMemoryHeld(b *testing.B) {
	n := benchLeases(b, 100_000)
	for range b.N {
		c := servertest.Start(b, 1, productionMemory(n))
		cl := c.Leases(c.WaitLeader())
		heap0, rss0 := settledMemory(b)
		m0 := runtimeMemory()
		start := time.Now()
		grantMany(b, cl, 0, n)
		grantRate := float64(n) / time.Since(start).Seconds()
		filled := runtimeMemory()
		heap1, rss1 := settledMemory(b)
		b.ReportMetric(float64(heap1-heap0)/float64(n), "heap-B/lease")
		b.ReportMetric(float64(rss1.total-rss0.total)/float64(n), "rss-B/lease")
		b.ReportMetric(float64(rss1.anon-rss0.anon)/float64(n), "rssanon-B/lease")
		b.ReportMetric(float64(rss1.file-rss0.file)/float64(n), "rssfile-B/lease")
		b.ReportMetric(grantRate, "grants/s")
		// The collector's share of the CPU the node used while granting: what a memory limit costs.
		b.ReportMetric(100*(filled.gcCPU-m0.gcCPU)/(filled.usedCPU-m0.usedCPU), "gc-cpu-%")
		// Where the RSS above the live heap is (runtime/metrics, same moment): freed heap pages the
		// runtime still holds (retained), the unused tails of spans in use (fragmentation), and, after
		// returning every free page to the OS, what the RSS would be without the retained part.
		m1 := runtimeMemory()
		b.ReportMetric((float64(m1.retained)-float64(m0.retained))/float64(n), "retained-B/lease")
		b.ReportMetric((float64(m1.unused)-float64(m0.unused))/float64(n), "frag-B/lease")
		b.ReportMetric((float64(m1.goal)-float64(m0.goal))/float64(n), "goal-B/lease")
		debug.FreeOSMemory()
		b.ReportMetric(float64(readRSS(b).total-rss0.total)/float64(n), "rss-freed-B/lease")
		writeHeapProfile(b)
		c.Close()
	}
}

// grantMany acquires the leases numbered from+1 to from+n (benchAcquire) with 256 concurrent callers.
func grantMany(b *testing.B, cl leasepb.LeasesClient, from, n int) {
	acquireMany(b, cl, n, func(i int) *leasepb.AcquireRequest {
		a := benchAcquire(from + i)
		return &leasepb.AcquireRequest{Resource: a.Resource, Holder: a.Holder, TtlMs: a.TtlMs, RequestId: a.RequestId}
	})
}

// acquireMany makes the Acquire requests req(1) to req(n) with 256 concurrent callers; a refusal fails b.
func acquireMany(b *testing.B, cl leasepb.LeasesClient, n int, req func(i int) *leasepb.AcquireRequest) {
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range 256 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				r := req(int(i))
				if _, err := cl.Acquire(ctx, r); err != nil {
					b.Errorf("%s, %s after the first grant: %v", r.GetResource(), time.Since(start).Round(time.Millisecond), err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
}

// benchAcquire is lease number i of the memory benchmarks: short names, 1,000 holders, a 16-byte request
// id, no value, a 10-minute TTL.
func benchAcquire(i int) *wirepb.AcquireCmd {
	return &wirepb.AcquireCmd{
		Resource: fmt.Sprintf("mem/%07d", i), Holder: fmt.Sprintf("h%03d", i%benchHolders),
		TtlMs: (10 * time.Minute).Milliseconds(), RequestId: fmt.Sprintf("%016x", uint64(i)*0x9e3779b97f4a7c15),
	}
}

// BenchmarkRestartReady measures how long a node whose data dir holds LEASED_BENCH_LEASES (default
// 1,000,000) leases takes from start to ready (/readyz 200). A one-node cluster is started and stopped,
// its data dir replaced by one restored from a snapshot of that many leases (BenchmarkMemoryHeld's), and
// started again: restored-ready-s, a snapshot to load and no log. It is then
// given 20,000 more grants, so that its log has entries to replay after the snapshot, stopped and started
// once more: ready-s, the restart of a node that was serving.
func BenchmarkRestartReady(b *testing.B) {
	n := benchLeases(b, 1_000_000)
	const replay = 20_000
	snap := snapshotOf(b, n)
	b.ReportMetric(float64(len(snap)), "snapshot-bytes")
	for range b.N {
		c := servertest.Start(b, 1, func(cfg *server.Config) {
			productionMemory(n + replay)(cfg)
			// Measured here: loading and replaying. A leader that takes over a million leases checkpoints
			// them all one interval later (a thousand 23 KB entries); at the lowest I/O priority on a busy
			// disk that took over a minute, so it is kept out of this measurement's window.
			cfg.CheckpointInterval = 10 * time.Minute
		})
		cfg := c.Config(0)
		c.Stop(0)
		if err := os.RemoveAll(cfg.DataDir); err != nil {
			b.Fatal(err)
		}
		if _, err := server.RestoreDataDir(server.RestoreConfig{Snapshot: snap, Name: cfg.Name, DataDir: cfg.DataDir, InitialCluster: cfg.InitialCluster}); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(timeToReady(b, c).Seconds(), "restored-ready-s")
		b.Logf("restored node ready, applied index %d", c.Node(0).AppliedIndex())
		grantMany(b, c.Leases(0), n, replay)
		c.Stop(0)
		b.ReportMetric(timeToReady(b, c).Seconds(), "ready-s")
		c.Close()
	}
}

// timeToReady restarts the stopped node 0 and times it to ready.
func timeToReady(b *testing.B, c *servertest.Cluster) time.Duration {
	runtime.GC()
	start := time.Now()
	c.Restart(0)
	waitReady(b, c, 0)
	return time.Since(start)
}

// snapshotOf encodes a state machine holding leases 1 to n (benchAcquire).
func snapshotOf(b *testing.B, n int) []byte {
	f := fsm.New()
	for i := 1; i <= n; i++ {
		if _, err := f.Apply(uint64(i), &wirepb.Command{Op: &wirepb.Command_Acquire{Acquire: benchAcquire(i)}}); err != nil {
			b.Fatal(err)
		}
	}
	data, err := f.Snapshot()
	if err != nil {
		b.Fatal(err)
	}
	return data
}

// waitReady polls until node i knows a leader, the rule of leased's /readyz (cmd/leased/admin.go): the
// moment an orchestrator would route clients to it. A minute at most.
func waitReady(b *testing.B, c *servertest.Cluster, i int) {
	deadline := time.Now().Add(time.Minute)
	for c.Node(i).Leader() == 0 {
		if time.Now().After(deadline) {
			b.Fatal("no leader known within a minute of the restart")
		}
		time.Sleep(time.Millisecond) // poll interval
	}
}

// rss is the process's resident memory from /proc/self/status, in bytes.
type rss struct{ total, anon, file int64 }

// settledMemory waits for the node's raft loop and the lessor's checkpoints to go quiet (they run every
// few seconds: two checkpoint intervals), collects garbage, and reads the live heap and the RSS.
func settledMemory(b *testing.B) (uint64, rss) {
	time.Sleep(2 * server.DefaultConfig().CheckpointInterval) // let idle checkpoints of every lease apply: memory, not a condition, is measured
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc, readRSS(b)
}

// heapClasses are runtime/metrics' view of the heap's memory beyond its live objects, in bytes, and its
// estimates of the CPU seconds the collector and the whole process (less idle time) have spent.
type heapClasses struct {
	retained, unused, goal uint64
	gcCPU, usedCPU         float64
}

func runtimeMemory() heapClasses {
	samples := []metrics.Sample{
		{Name: "/memory/classes/heap/free:bytes"},   // free pages not yet returned to the OS
		{Name: "/memory/classes/heap/unused:bytes"}, // unused parts of spans holding objects
		{Name: "/gc/heap/goal:bytes"},               // the heap size at which the next collection ends
		{Name: "/cpu/classes/gc/total:cpu-seconds"},
		{Name: "/cpu/classes/total:cpu-seconds"},
		{Name: "/cpu/classes/idle:cpu-seconds"},
	}
	metrics.Read(samples)
	return heapClasses{
		retained: samples[0].Value.Uint64(), unused: samples[1].Value.Uint64(), goal: samples[2].Value.Uint64(),
		gcCPU: samples[3].Value.Float64(), usedCPU: samples[4].Value.Float64() - samples[5].Value.Float64(),
	}
}

func readRSS(b *testing.B) rss {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Skipf("no /proc/self/status: %v", err)
	}
	var r rss
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(val), " kB"), 10, 64)
		switch name {
		case "VmRSS":
			r.total = kb << 10
		case "RssAnon":
			r.anon = kb << 10
		case "RssFile":
			r.file = kb << 10
		}
	}
	return r
}

func writeHeapProfile(b *testing.B) {
	path := os.Getenv("LEASED_BENCH_HEAPPROFILE")
	if path == "" {
		return
	}
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		b.Fatal(err)
	}
}
