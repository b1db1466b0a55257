package main

import (
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

// needZooKeeper skips t, loudly, where ZooKeeper is not installed (bench/zookeeper.sh installs it as
// root) — except under CI=true, where that fails t: the ZooKeeper side must not rot unseen.
func needZooKeeper(t *testing.T) {
	t.Helper()
	why := zkAvailable()
	if why == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("ZooKeeper not available under CI=true: %s", why)
	}
	t.Logf("\n!!! SKIP: the ZooKeeper side of bench-compare is NOT tested: %s\n", why)
	t.Skip(why)
}

// The ZooKeeper side end to end on one short-lived ensemble: every workload the table has for it does
// real work, the rows with no equivalent say so, and a killed leader's successor takes writes.
func TestZooKeeperSmoke(t *testing.T) {
	needZooKeeper(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s := &zkSystem{}
	t.Cleanup(s.stop)
	if err := s.start(ctx, t.TempDir()); err != nil {
		t.Fatalf("start: %v", err)
	}
	if !strings.HasPrefix(s.version, "3.") {
		t.Errorf("srvr version %q", s.version)
	}
	cfg := config{duration: 500 * time.Millisecond, maxOps: 1000, kills: 1, contendedClients: 4, fillTimeout: time.Minute}
	positive := func(what string, vals map[string]float64, err error, keys ...string) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		for _, k := range keys {
			if vals[k] <= 0 {
				t.Errorf("%s: %s = %v, want > 0 (all: %v)", what, k, vals[k], vals)
			}
		}
		if vals[strings.Split(keys[0], "/")[0]+"/errors"] > 0 {
			t.Errorf("%s: failed operations: %v", what, vals)
		}
	}
	vals, err := acquireCell(ctx, s, cfg, 4)
	positive("acquire", vals, err, "acquire-4/rate", "acquire-4/p50", "acquire-4/cpu")
	vals, err = contendedCell(ctx, s, cfg)
	positive("contended", vals, err, "contended/rate")
	vals, err = readCell(ctx, s, cfg, true)
	positive("read", vals, err, "read-serializable/rate")
	for what, err := range map[string]error{
		"linearizable read": func() error { _, err := readCell(ctx, s, cfg, false); return err }(),
		"renew":             func() error { _, err := renewCell(ctx, s, cfg, 1); return err }(),
		"batched":           func() error { _, err := batchedCell(ctx, s, cfg); return err }(),
	} {
		var na notApplicableError
		if !errors.As(err, &na) {
			t.Errorf("%s: %v, want not applicable", what, err)
		}
	}
	vals, err = memoryCell(ctx, s, cfg, 500)
	positive("memory", vals, err, "memory-500/growth-mb", "memory-500/restart")
	before, err := s.term(ctx)
	if err != nil {
		t.Fatal(err)
	}
	vals, err = failoverCell(ctx, s, cfg)
	positive("failover", vals, err, "failover/max", "handoff/max")
	if after, err := s.term(ctx); err != nil || after <= before {
		t.Errorf("epoch %d after two leader stops, %d before (err %v): want it to grow", after, before, err)
	}
}

// The table has a column per system run, leased's ratio against each peer, and a row's reason where a
// system has no equivalent.
func TestTableComparesLeasedWithEachPeer(t *testing.T) {
	cfg := config{systems: map[string]bool{"etcd": true, "zookeeper": true, "leased": true},
		rows: map[string]bool{"renew": true}, renewClients: []int{1}}
	res := newResults()
	res.add("etcd", map[string]float64{"renew-1/rate": 100})
	res.add("leased", map[string]float64{"renew-1/rate": 300})
	res.notApplicable("zookeeper", "renew-1", "no renewal")
	var b strings.Builder
	writeTable(&b, cfg, res)
	out := b.String()
	for _, want := range []string{
		"| workload | etcd | zookeeper | leased | leased vs etcd | leased vs zookeeper |",
		"| unary renew, 1 client | 100/s | n/a: no renewal | 300/s | 3.00× | — |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

// --systems names only known systems; the default has all three or says loudly which one it lacks.
func TestParseSystems(t *testing.T) {
	var errs []error
	if parseSystems("etcd,consul", io.Discard, &errs); len(errs) != 1 {
		t.Errorf("unknown system: errors %v", errs)
	}
	errs = nil
	var warned strings.Builder
	got := parseSystems("", &warned, &errs)
	if len(errs) != 0 || !got["etcd"] || !got["leased"] {
		t.Fatalf("default systems %v, errors %v", got, errs)
	}
	if zkAvailable() == "" != got["zookeeper"] || (warned.Len() > 0) == got["zookeeper"] {
		t.Errorf("default systems %v with ZooKeeper available %q; warned %q", got, zkAvailable(), warned.String())
	}
}
