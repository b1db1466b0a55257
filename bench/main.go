// Command bench compares leased with etcd and ZooKeeper side by side (`make bench-compare`,
// docs/benchmarks.md): it starts a fresh three-node cluster of each on loopback for every cell, drives
// each with the same load loop (client/loadgen) — etcd's clientv3 and concurrency package, go-zookeeper
// with the standard recipes, the leased SDK — interleaving the systems, and prints one markdown table
// with all of them and leased's ratio against each.
//
// It is its own Go module so that etcd and the ZooKeeper client stay out of leased's go.mod. Every node
// it starts is SIGKILLed when it ends, on success, failure or a signal.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/leased/leased/client/loadgen"
)

// allRows are the row groups --rows selects from; defaultRows those it runs unless told (steady takes
// 2 × --reps × --steady on its own).
var (
	allSystems  = []string{"etcd", "zookeeper", "leased"} // the table's column order
	allRows     = []string{"acquire", "contended", "renew", "read", "batched", "steady", "failover", "memory"}
	defaultRows = []string{"acquire", "contended", "renew", "read", "batched", "failover", "memory"}
)

// config is the command line.
type config struct {
	etcdBin, leasedBin string
	systems            map[string]bool // of allSystems
	rows               map[string]bool
	duration           time.Duration // of each load cell
	reps               int
	clients            []int // acquire rows
	renewClients       []int
	contendedClients   int
	kills              int
	batchLeases        int           // held leases of the batched row
	batchSize          int           // leases renewed per operation
	batchStreams       int           // keep-alive streams (workers) of the batched row
	steady             time.Duration // length of the steady row's run
	steadyClients      int
	leases             []int         // held leases of the memory rows
	fillTimeout        time.Duration // bound on taking them
	maxOps             int           // per load cell
	dir                string
	out                string
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	killAll()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func parse(args []string, stderr io.Writer) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	env := func(name, def string) string {
		if v := os.Getenv("BENCH_" + name); v != "" {
			return v
		}
		return def
	}
	fs.StringVar(&cfg.etcdBin, "etcd", env("ETCD", "bin/etcd"), "etcd binary (env BENCH_ETCD)")
	fs.StringVar(&cfg.leasedBin, "leased", env("LEASED", "bin/leased"), "leased binary (env BENCH_LEASED)")
	systemsFlag := fs.String("systems", env("SYSTEMS", ""), "systems to run, of "+strings.Join(allSystems, ",")+"; one alone measures it without the others (default all three, or etcd,leased when ZooKeeper is not installed; env BENCH_SYSTEMS)")
	rowsFlag := fs.String("rows", env("ROWS", strings.Join(defaultRows, ",")), "row groups to run, of "+strings.Join(allRows, ",")+" (env BENCH_ROWS)")
	durFlag := fs.String("duration", env("DURATION", "10s"), "load time of each cell (env BENCH_DURATION)")
	repsFlag := fs.String("reps", env("REPS", "2"), "repetitions of every cell, systems interleaved (env BENCH_REPS)")
	clientsFlag := fs.String("clients", env("CLIENTS", "1,16,64,256"), "client counts of the acquire rows (env BENCH_CLIENTS)")
	renewFlag := fs.String("renew-clients", env("RENEW_CLIENTS", "1,64"), "client counts of the renew rows (env BENCH_RENEW_CLIENTS)")
	contFlag := fs.String("contended-clients", env("CONTENDED_CLIENTS", "16"), "clients of the contended row (env BENCH_CONTENDED_CLIENTS)")
	batchLeasesFlag := fs.String("batch-leases", env("BATCH_LEASES", "20000"), "held leases of the batched row (env BENCH_BATCH_LEASES)")
	batchSizeFlag := fs.String("batch-size", env("BATCH_SIZE", "1000"), "leases renewed per operation of the batched row (env BENCH_BATCH_SIZE)")
	batchStreamsFlag := fs.String("batch-streams", env("BATCH_STREAMS", "4"), "keep-alive streams of the batched row (env BENCH_BATCH_STREAMS)")
	steadyFlag := fs.String("steady", env("STEADY", "10m"), "length of the steady row's run (env BENCH_STEADY)")
	steadyClientsFlag := fs.String("steady-clients", env("STEADY_CLIENTS", "256"), "workers of the steady row (env BENCH_STEADY_CLIENTS)")
	killsFlag := fs.String("kills", env("KILLS", "3"), "leader kills of the failover row (env BENCH_KILLS)")
	leasesFlag := fs.String("leases", env("LEASES", "10000,100000,1000000"), "held leases of the memory and restart rows, one row each (env BENCH_LEASES)")
	fillFlag := fs.String("fill-timeout", env("FILL_TIMEOUT", "60m"), "bound on acquiring --leases (env BENCH_FILL_TIMEOUT)")
	maxOpsFlag := fs.String("max-ops", env("MAX_OPS", strconv.Itoa(loadgen.DefaultMaxOps)), "most operations of one load cell (env BENCH_MAX_OPS)")
	fs.StringVar(&cfg.dir, "dir", env("DIR", ""), "parent of the data dirs (default a new temporary dir, removed at the end; env BENCH_DIR)")
	fs.StringVar(&cfg.out, "out", env("OUT", ""), "also write the table to this file (env BENCH_OUT)")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var errs []error
	cfg.systems = parseSystems(*systemsFlag, stderr, &errs)
	cfg.rows = map[string]bool{}
	for r := range strings.SplitSeq(*rowsFlag, ",") {
		r = strings.TrimSpace(r)
		if !slices.Contains(allRows, r) {
			errs = append(errs, fmt.Errorf("--rows: unknown row %q (want %s)", r, strings.Join(allRows, ",")))
		}
		cfg.rows[r] = true
	}
	var err error
	if cfg.duration, err = time.ParseDuration(*durFlag); err != nil || cfg.duration <= 0 {
		errs = append(errs, fmt.Errorf("--duration: want a positive duration, got %q", *durFlag))
	}
	if cfg.fillTimeout, err = time.ParseDuration(*fillFlag); err != nil || cfg.fillTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--fill-timeout: want a positive duration, got %q", *fillFlag))
	}
	cfg.reps = positive("reps", *repsFlag, &errs)
	cfg.contendedClients = positive("contended-clients", *contFlag, &errs)
	cfg.kills = positive("kills", *killsFlag, &errs)
	if cfg.steady, err = time.ParseDuration(*steadyFlag); err != nil || cfg.steady <= 0 {
		errs = append(errs, fmt.Errorf("--steady: want a positive duration, got %q", *steadyFlag))
	}
	cfg.steadyClients = positive("steady-clients", *steadyClientsFlag, &errs)
	cfg.batchLeases = positive("batch-leases", *batchLeasesFlag, &errs)
	cfg.batchSize = positive("batch-size", *batchSizeFlag, &errs)
	cfg.batchStreams = positive("batch-streams", *batchStreamsFlag, &errs)
	cfg.leases = positives("leases", *leasesFlag, &errs)
	cfg.maxOps = positive("max-ops", *maxOpsFlag, &errs)
	cfg.clients = positives("clients", *clientsFlag, &errs)
	cfg.renewClients = positives("renew-clients", *renewFlag, &errs)
	if cfg.maxOps > loadgen.MaxOpsLimit {
		errs = append(errs, fmt.Errorf("--max-ops: at most %d", loadgen.MaxOpsLimit))
	}
	for name, bin := range map[string]string{"etcd": cfg.etcdBin, "leased": cfg.leasedBin} {
		if !cfg.systems[name] {
			continue
		}
		if _, err := os.Stat(bin); err != nil {
			errs = append(errs, fmt.Errorf("binary: %w (make bench-compare builds both)", err))
		}
	}
	return cfg, errors.Join(errs...)
}

// parseSystems reads --systems. Without it, every system runs, but ZooKeeper only where it is installed:
// without, a loud warning says the table lacks it. Named explicitly, a missing ZooKeeper is an error.
func parseSystems(flag string, stderr io.Writer, errs *[]error) map[string]bool {
	why := zkAvailable()
	if flag == "" {
		flag = strings.Join(allSystems, ",")
		if why != "" {
			flag = "etcd,leased"
			fmt.Fprintf(stderr, "\n!!! bench: ZooKeeper NOT measured: %s; running --systems=%s\n\n", why, flag)
		}
	}
	systems := map[string]bool{}
	for s := range strings.SplitSeq(flag, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains(allSystems, s) {
			*errs = append(*errs, fmt.Errorf("--systems: unknown system %q (want %s)", s, strings.Join(allSystems, ",")))
		}
		if s == "zookeeper" && why != "" {
			*errs = append(*errs, fmt.Errorf("--systems: zookeeper: %s", why))
		}
		systems[s] = true
	}
	return systems
}

func positive(flag, s string, errs *[]error) int {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || n < 1 {
		*errs = append(*errs, fmt.Errorf("--%s: want a positive integer, got %q", flag, s))
	}
	return n
}

func positives(flag, s string, errs *[]error) []int {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		out = append(out, positive(flag, f, errs))
	}
	return out
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parse(args, stderr)
	if err != nil {
		return err
	}
	root, keep := cfg.dir, cfg.dir != ""
	if root == "" {
		if root, err = os.MkdirTemp("", "leased-bench-"); err != nil {
			return err
		}
		// A temporary dir is removed at the end, unless a cell failed: its logs tell why.
		defer func() {
			if keep && ctx.Err() == nil {
				fmt.Fprintf(stderr, "kept the data and logs of the failed cells in %s\n", root)
				return
			}
			_ = os.RemoveAll(root)
		}()
	}
	most := slices.Max(cfg.leases)
	zookeeper := &zkSystem{}
	var selected []system
	for _, s := range []system{&etcdSystem{bin: cfg.etcdBin}, zookeeper, &leasedSystem{bin: cfg.leasedBin, maxLeases: max(most+most/5, 1_000_000)}} {
		if cfg.systems[s.name()] {
			selected = append(selected, s)
		}
	}
	res := newResults()
	cs := cells(cfg)
	start := time.Now()
	for rep := range cfg.reps {
		for ci, c := range cs {
			for _, s := range inTurn(selected, rep+ci) {
				if err := ctx.Err(); err != nil {
					return err
				}
				dir := filepath.Join(root, fmt.Sprintf("rep%d-%s-%s", rep+1, c.name, s.name()))
				vals, err := runCell(ctx, s, c, cfg, dir)
				var na notApplicableError
				if errors.As(err, &na) {
					res.notApplicable(s.name(), c.name, string(na))
					fmt.Fprintf(stderr, "rep %d/%d %-12s %-9s %v\n", rep+1, cfg.reps, c.name, s.name(), na)
					continue
				}
				if err != nil {
					keep = true
					fmt.Fprintf(stderr, "rep %d/%d %-12s %-9s FAILED: %v (logs in %s)\n", rep+1, cfg.reps, c.name, s.name(), err, dir)
					continue
				}
				res.add(s.name(), vals)
				fmt.Fprintf(stderr, "rep %d/%d %-12s %-9s %s\n", rep+1, cfg.reps, c.name, s.name(), describe(vals))
				if cfg.dir == "" {
					_ = os.RemoveAll(dir) // a held-leases cell leaves gigabytes
				}
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Machine: %d CPUs (%s/%s), %s; %s, %v per cell; %s; %s; %s; took %v.\n\n",
		runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, cpuModel(), plural(cfg.reps, "repetition"), cfg.duration,
		versionOf(ctx, cfg, "etcd", cfg.etcdBin), zkVersion(cfg, zookeeper), versionOf(ctx, cfg, "leased", cfg.leasedBin),
		time.Since(start).Round(time.Second))
	writeTable(&b, cfg, res)
	_, _ = io.WriteString(stdout, b.String())
	if cfg.out != "" {
		return os.WriteFile(cfg.out, []byte(b.String()), 0o644)
	}
	return nil
}

// inTurn is systems rotated to start at the k-th (modulo their number): each goes first in turn, cell by
// cell and repetition by repetition, so that none always runs on the machine's freshest (or most tired)
// state.
func inTurn(systems []system, k int) []system {
	k %= len(systems)
	return append(slices.Clone(systems[k:]), systems[:k]...)
}

// runCell starts s fresh in dir, runs c on it and stops it again, whatever happens. Whatever dir holds
// is removed first: with --dir given twice, the nodes would otherwise restart on the last run's data
// (another cluster's members, on other ports) and never elect a leader.
func runCell(ctx context.Context, s system, c cell, cfg config, dir string) (map[string]float64, error) {
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	defer s.stop()
	if err := s.start(ctx, dir); err != nil {
		return nil, fmt.Errorf("start: %w", err)
	}
	return c.run(ctx, s, cfg)
}

func describe(vals map[string]float64) string {
	keys := make([]string, 0, len(vals))
	for k := range vals {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%.4g", k[strings.IndexByte(k, '/')+1:], vals[k]))
	}
	return strings.Join(parts, " ")
}

// version is the first line a binary's --version prints (its path if that fails).
func version(ctx context.Context, bin string) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--version").Output()
	if err != nil {
		return bin
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line
}

// cpuModel is the first "model name" of /proc/cpuinfo ("" if unknown).
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}

// zkVersion is the version the ZooKeeper servers reported, if they ran.
func zkVersion(cfg config, s *zkSystem) string {
	switch {
	case !cfg.systems["zookeeper"]:
		return "zookeeper not run"
	case s.version == "":
		return "ZooKeeper (version unknown)"
	}
	return "ZooKeeper " + s.version
}

// versionOf is version's answer for a system the run measured, and says so for one it did not.
func versionOf(ctx context.Context, cfg config, system, bin string) string {
	if !cfg.systems[system] {
		return system + " not run"
	}
	return version(ctx, bin)
}
