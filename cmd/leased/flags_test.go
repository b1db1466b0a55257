package main

import (
	"bytes"
	"errors"
	"flag"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/leased/leased/server"
)

func env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

func parse(t *testing.T, args []string, getenv func(string) string) (options, error) {
	t.Helper()
	if getenv == nil {
		getenv = env()
	}
	var out bytes.Buffer
	return parseFlags(args, getenv, &out)
}

func TestDefaultsComeFromServerDefaultConfig(t *testing.T) {
	o, err := parse(t, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := server.DefaultConfig()
	got := o.cfg
	got.Name, got.DataDir, got.ClientAddr, got.PeerAddr, got.InitialCluster = "", "", "", "", nil
	if !reflect.DeepEqual(got, want) {
		t.Errorf("defaults differ from server.DefaultConfig():\n got %+v\nwant %+v", got, want)
	}
	if o.logLevel != slog.LevelInfo || o.logFormat != "text" || o.adminAddr == "" {
		t.Errorf("log level %v, format %q, admin %q", o.logLevel, o.logFormat, o.adminAddr)
	}
}

func TestEveryFlagSetsItsField(t *testing.T) {
	args := []string{
		"--name=n2", "--data-dir=/d", "--client-addr=h:1", "--peer-addr=h:2", "--admin-addr=h:3", "--http-addr=h:4",
		"--initial-cluster=n1=h:10, n2=h:2 ,n3=h:30",
		"--election-timeout=210ms", "--snapshot-entries=11",
		"--snapshot-catchup=12", "--checkpoint-interval=13s", "--expiry-batch=14", "--expiry-rate=39", "--watch-history=15",
		"--proposal-timeout=16s", "--disk-stall-timeout=27s", "--max-resource-bytes=17", "--max-holder-bytes=18", "--max-value-bytes=19",
		"--min-ttl=20ms", "--max-ttl=21m", "--max-lock-delay=22s", "--max-leases-per-holder=23",
		"--max-request-bytes=24", "--max-keepalive-leases=25", "--max-list-limit=26",
		"--max-watchers=31", "--max-watchers-per-conn=32", "--max-waiters=33", "--max-waiters-per-resource=34",
		"--max-streams-per-conn=35", "--max-leases=36", "--quota-bytes=37", "--watch-history-bytes=38",
		"--log-level=debug", "--log-format=json",
		"--advertise-client-addr=a:1", "--advertise-peer-addr=a:2", "--gossip-addr=h:4", "--advertise-gossip-addr=a:4",
		"--join=g1:4, g2:4", "--initial-cluster-state=existing", "--join-timeout=28s", "--gossip-key-file=/k",
		"--insecure-gossip", "--initial-cluster-token=prod-1",
		"--max-leases-per-identity=40", "--max-watchers-per-identity=41", "--max-waiters-per-identity=42",
		"--quota-bytes-per-identity=43", "--max-connections=44", "--max-connection-idle=45s",
	}
	o, err := parse(t, args, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := server.DefaultConfig()
	want.Name, want.DataDir, want.ClientAddr, want.PeerAddr, want.HTTPAddr = "n2", "/d", "h:1", "h:2", "h:4"
	want.InitialCluster = map[string]string{"n1": "h:10", "n2": "h:2", "n3": "h:30"}
	want.TickInterval = 21 * time.Millisecond // --election-timeout over the default 10 election ticks
	want.SnapshotEntries, want.SnapshotCatchUp = 11, 12
	want.CheckpointInterval, want.ExpiryBatch, want.ExpiryRate, want.WatchHistory = 13*time.Second, 14, 39, 15
	want.ProposalTimeout, want.DiskStallTimeout = 16*time.Second, 27*time.Second
	want.WatchHistoryBytes = 38
	want.AdvertiseClientAddr, want.AdvertisePeerAddr, want.GossipAddr, want.AdvertiseGossipAddr = "a:1", "a:2", "h:4", "a:4"
	want.Join, want.InitialClusterState, want.JoinTimeout = []string{"g1:4", "g2:4"}, server.ClusterStateExisting, 28*time.Second
	want.InsecureGossip, want.InitialClusterToken = true, "prod-1"
	want.Limits = server.Limits{
		MaxResourceBytes: 17, MaxHolderBytes: 18, MaxValueBytes: 19,
		MaxRequestIDBytes: want.Limits.MaxRequestIDBytes,
		MinTTL:            20 * time.Millisecond, MaxTTL: 21 * time.Minute, MaxLockDelay: 22 * time.Second,
		MaxLeasesPerHolder: 23, MaxRequestBytes: 24, MaxKeepAliveLeases: 25, MaxListLimit: 26,
		MaxWatchers: 31, MaxWatchersPerConn: 32, MaxWaiters: 33, MaxWaitersPerResource: 34,
		MaxStreamsPerConn: 35, MaxLeases: 36, QuotaBytes: 37,
		MaxLeasesPerIdentity: 40, MaxWatchersPerIdentity: 41, MaxWaitersPerIdentity: 42, QuotaBytesPerIdentity: 43,
		MaxConnections: 44, MaxConnectionIdle: 45 * time.Second,
	}
	if !reflect.DeepEqual(o.cfg, want) {
		t.Errorf("config:\n got %+v\nwant %+v", o.cfg, want)
	}
	if o.adminAddr != "h:3" || o.logLevel != slog.LevelDebug || o.logFormat != "json" || o.gossipKeyFile != "/k" {
		t.Errorf("admin %q, level %v, format %q", o.adminAddr, o.logLevel, o.logFormat)
	}
}

func TestEnvironmentAppliesAndFlagsOverrideIt(t *testing.T) {
	getenv := env(
		"LEASED_NAME", "from-env",
		"LEASED_DATA_DIR", "/env/dir",
		"LEASED_ELECTION_TIMEOUT", "500ms",
		"LEASED_INITIAL_CLUSTER", "from-env=127.0.0.1:1",
		"LEASED_MAX_KEEPALIVE_LEASES", "9",
		"LEASED_QUOTA_BYTES", "1048576",
		"LEASED_MAX_WATCHERS_PER_CONN", "7",
		"LEASED_LOG_FORMAT", "json",
		"LEASED_HTTP_ADDR", "127.0.0.1:7501",
	)
	o, err := parse(t, nil, getenv)
	if err != nil {
		t.Fatal(err)
	}
	if o.cfg.Name != "from-env" || o.cfg.DataDir != "/env/dir" || o.cfg.TickInterval != 50*time.Millisecond ||
		o.cfg.Limits.MaxKeepAliveLeases != 9 || o.cfg.Limits.QuotaBytes != 1<<20 || o.cfg.Limits.MaxWatchersPerConn != 7 || o.logFormat != "json" || o.cfg.HTTPAddr != "127.0.0.1:7501" || o.cfg.InitialCluster["from-env"] != "127.0.0.1:1" {
		t.Errorf("environment not applied: %+v (format %q)", o.cfg, o.logFormat)
	}

	o, err = parse(t, []string{"--name", "from-flag", "--election-timeout=50ms", "--initial-cluster=from-flag=127.0.0.1:2"}, getenv)
	if err != nil {
		t.Fatal(err)
	}
	if o.cfg.Name != "from-flag" || o.cfg.TickInterval != 5*time.Millisecond {
		t.Errorf("flag did not win over environment: name %q tick %v", o.cfg.Name, o.cfg.TickInterval)
	}
	if want := map[string]string{"from-flag": "127.0.0.1:2"}; !reflect.DeepEqual(o.cfg.InitialCluster, want) {
		t.Errorf("initial cluster %v, want %v (the flag replaces the variable, it does not merge)", o.cfg.InitialCluster, want)
	}
	if o.cfg.DataDir != "/env/dir" {
		t.Errorf("a variable without a flag should still apply: data dir %q", o.cfg.DataDir)
	}
}

func TestBadValuesAreUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		getenv func(string) string
		want   string // in the message
	}{
		{"bad duration", []string{"--election-timeout=soon"}, nil, "--election-timeout"},
		{"bad duration in env", nil, env("LEASED_CHECKPOINT_INTERVAL", "5"), "LEASED_CHECKPOINT_INTERVAL"},
		{"bad int", []string{"--expiry-batch=many"}, nil, "--expiry-batch"},
		{"unknown flag", []string{"--no-such-flag"}, nil, "--no-such-flag"},
		{"positional argument", []string{"--name=a", "extra"}, nil, `"extra"`},
		{"bad log level", []string{"--log-level=loud"}, nil, "debug, info, warn or error"},
		{"bad log format", []string{"--log-format=xml"}, nil, "text or json"},
		{"cluster without =", []string{"--initial-cluster=n1"}, nil, `"n1" is not name=host:port`},
		{"cluster empty member", []string{"--initial-cluster=n1=h:1,,n2=h:2"}, nil, "empty member"},
		{"cluster empty name", []string{"--initial-cluster==h:1"}, nil, "not name=host:port"},
		{"cluster no port", []string{"--initial-cluster=n1=h"}, nil, "want host:port"},
		{"cluster bad port", []string{"--initial-cluster=n1=h:99999"}, nil, "port must be"},
		{"cluster no host", []string{"--initial-cluster=n1=:7201"}, nil, "no host"},
		{"cluster duplicate name", []string{"--initial-cluster=n1=h:1,n1=h:2"}, nil, "n1 appears twice"},
		{"cluster duplicate address", []string{"--initial-cluster=n1=h:1,n2=h:1"}, nil, "same address h:1"},
		{"cluster in env", nil, env("LEASED_INITIAL_CLUSTER", "n1=h:1,n1=h:2"), "LEASED_INITIAL_CLUSTER"},
		{"bad cluster state", []string{"--initial-cluster-state=joining"}, nil, "want new or existing"},
		{"join without port", []string{"--join=n1"}, nil, "want host:port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(t, tc.args, tc.getenv)
			var ue usageError
			if !errors.As(err, &ue) {
				t.Fatalf("got %v, want a usage error", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not mention %q", err, tc.want)
			}
			var stderr bytes.Buffer
			if code := exitCode(err, &stderr); code != 2 {
				t.Errorf("exit code %d, want 2", code)
			}
			if lines := strings.Count(stderr.String(), "\n"); lines != 1 {
				t.Errorf("want a one-line error, got %q", stderr.String())
			}
		})
	}
}

// --help lists the essentials and points to --help-all and the config file; --help-all lists every flag
// with its variable.
func TestHelpListsTheEssentialsAndHelpAllEveryFlag(t *testing.T) {
	help := func(arg string) string {
		var out bytes.Buffer
		_, err := parseFlags([]string{arg}, env(), &out)
		if !errors.Is(err, errHelp) {
			t.Fatalf("%s: got %v, want errHelp", arg, err)
		}
		if code := exitCode(err, &bytes.Buffer{}); code != 0 {
			t.Errorf("exit code %d for %s, want 0", code, arg)
		}
		return out.String()
	}
	short, all := help("--help"), help("--help-all")
	for _, want := range []string{"--initial-cluster ", "LEASED_INITIAL_CLUSTER", "--election-timeout ", "--config-file ", "--cert-file ", "--version",
		"leased --help-all", `"Configuration file"`} {
		if !strings.Contains(short, want) {
			t.Errorf("--help does not mention %s", want)
		}
	}
	for _, tuning := range []string{"--max-leases ", "--quota-bytes ", "--tick ", "--election-ticks ", "--snapshot-entries ", "--max-connections "} {
		if strings.Contains(short, tuning) {
			t.Errorf("--help lists the tuning flag %s", tuning)
		}
		if !strings.Contains(all, tuning) {
			t.Errorf("--help-all does not list %s", tuning)
		}
	}
	listed := func(s string) int { return strings.Count(s, "\n  --") }
	newFlagSet(&options{}).VisitAll(func(f *flag.Flag) {
		if !strings.Contains(all, "\n  --"+f.Name+" ") && !strings.Contains(all, "\n  --"+f.Name+"\n") {
			t.Errorf("--help-all does not list --%s", f.Name)
		}
	})
	if n := listed(short); n != len(essentialFlags) || n > 30 {
		t.Errorf("--help lists %d flags, want the %d essentials (about two dozen)", n, len(essentialFlags))
	}
}

func TestEnvName(t *testing.T) {
	if got := envName("max-keepalive-leases"); got != "LEASED_MAX_KEEPALIVE_LEASES" {
		t.Errorf("got %s", got)
	}
}
