package main

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// These tests cover the comparison's own arithmetic and parsing (and zookeeper_test.go the ZooKeeper side
// on a real ensemble); `make bench-compare-smoke` runs it all end to end. bench/ is its own module:
// scripts/test.sh runs them with `cd bench && go test ./...`.

func TestProcReadersReadThisProcess(t *testing.T) {
	cpu, err := cpuSeconds(os.Getpid())
	if err != nil || cpu < 0 {
		t.Fatalf("cpuSeconds = %v, %v", cpu, err)
	}
	rss, err := rssBytes(os.Getpid())
	if err != nil || rss < 1<<20 {
		t.Fatalf("rssBytes = %d, %v", rss, err)
	}
}

func TestRatioIsTimesBetterForLeased(t *testing.T) {
	if got := ratio([]float64{100, 300}, []float64{400}, true); got != "2.00×" { // rates: leased ÷ etcd
		t.Errorf("rate ratio = %s", got)
	}
	if got := ratio([]float64{3}, []float64{1, 1, 100}, false); got != "3.00×" { // latencies: etcd ÷ leased
		t.Errorf("latency ratio = %s", got)
	}
	if got := ratio(nil, []float64{1}, true); got != "—" {
		t.Errorf("missing side = %s", got)
	}
	if got := span([]float64{2, 1, 3}, perSec); got != "1/s – 3/s" {
		t.Errorf("span = %s", got)
	}
}

func TestParseRejectsBadFlags(t *testing.T) {
	bins := []string{"--etcd", os.Args[0], "--leased", os.Args[0]}
	for _, args := range [][]string{
		{"--rows", "acquire,nope"}, {"--duration", "0s"}, {"--reps", "0"}, {"--clients", "1,x"},
		{"--leases", "-1"}, {"--etcd", "/does/not/exist"}, {"extra"}, {"--steady", "0s"}, {"--batch-size", "0"},
	} {
		if _, err := parse(append(append([]string{}, bins...), args...), io.Discard); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
	if cfg, err := parse(bins, io.Discard); err != nil || cfg.rows["steady"] || !cfg.rows["batched"] || !cfg.rows["read"] {
		t.Fatalf("default rows %v, err %v: want every row but steady", cfg.rows, err)
	}
	cfg, err := parse(append(bins, "--rows", "acquire,memory", "--clients", "1,64"), io.Discard)
	if err != nil || !cfg.rows["acquire"] || cfg.rows["renew"] || len(cfg.clients) != 2 {
		t.Fatalf("cfg %+v, err %v", cfg, err)
	}
	var labels []string
	for _, r := range rows(cfg) {
		labels = append(labels, r.label)
	}
	if got := strings.Join(labels, "\n"); !strings.Contains(got, "acquire, 64 clients: p99") ||
		!strings.Contains(got, "restart of a follower") || !strings.Contains(got, "CPU per acquire (3 nodes), 1 client") {
		t.Fatalf("rows:\n%s", got)
	}
	// The read rows: serializable and linearizable, a rate and a p50 each, from the keys their cells report.
	cfg, err = parse(append(bins, "--rows", "read"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, r := range rows(cfg) {
		keys = append(keys, r.key)
	}
	var names []string
	for _, c := range cells(cfg) {
		names = append(names, c.name)
	}
	if got, want := strings.Join(keys, " "), "read-serializable/rate read-serializable/p50 read-linearizable/rate read-linearizable/p50"; got != want {
		t.Fatalf("read rows %q, want %q", got, want)
	}
	if got := strings.Join(names, " "); got != "read-serializable read-linearizable" {
		t.Fatalf("read cells %q", got)
	}
}

// emptyDirSystem records whether its data dir was empty when started; nothing else is called.
type emptyDirSystem struct {
	system
	empty bool
}

func (s *emptyDirSystem) start(_ context.Context, dir string) error {
	entries, err := os.ReadDir(dir)
	s.empty = err == nil && len(entries) == 0
	return errors.New("not started")
}
func (s *emptyDirSystem) stop() {}

// A cell starts on an empty dir even when --dir names one an earlier run filled.
func TestRunCellStartsFromAnEmptyDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "rep1-acquire-1-leased")
	if err := os.MkdirAll(filepath.Join(dir, "n1"), 0o755); err != nil {
		t.Fatal(err)
	}
	s := &emptyDirSystem{}
	if _, err := runCell(context.Background(), s, cell{}, config{}, dir); err == nil {
		t.Fatal("runCell: want the start's error")
	}
	if !s.empty {
		t.Fatal("the cell's system started on the last run's data")
	}
}

// namedSystem is a system known by its name alone.
type namedSystem struct {
	system
	n string
}

func (s namedSystem) name() string { return s.n }

// Over consecutive cells each system goes first once, whether two or three run.
func TestInTurnRotatesWhoGoesFirst(t *testing.T) {
	for _, names := range [][]string{{"etcd", "leased"}, {"etcd", "zookeeper", "leased"}} {
		var systems []system
		for _, n := range names {
			systems = append(systems, namedSystem{n: n})
		}
		first := map[string]int{}
		for k := range len(names) {
			order := inTurn(systems, k)
			if len(order) != len(names) {
				t.Fatalf("inTurn(%v, %d) has %d systems", names, k, len(order))
			}
			first[order[0].name()]++
		}
		for _, n := range names {
			if first[n] != 1 {
				t.Errorf("%v: %s went first %d times in %d cells", names, n, first[n], len(names))
			}
		}
	}
}
