package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// writeConfig writes a --config-file with text and returns its path.
func writeConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "leased.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestConfigFileSetsFlags(t *testing.T) {
	path := writeConfig(t, `# limits and tuning
max-leases: 123
quota-bytes: 4_096
max-connection-idle: 45s
insecure-peer: true
join: "g1:4, g2:4"
tick: 7ms
election-ticks: 21
heartbeat-ticks: 3
log-format: json
`)
	o, err := parse(t, []string{"--config-file=" + path}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := o.cfg
	if c.Limits.MaxLeases != 123 || c.Limits.QuotaBytes != 4096 || c.Limits.MaxConnectionIdle != 45*time.Second ||
		!o.tls.insecurePeer || !reflect.DeepEqual(c.Join, []string{"g1:4", "g2:4"}) || o.logFormat != "json" {
		t.Errorf("file not applied: %+v", o)
	}
	if c.TickInterval != 7*time.Millisecond || c.ElectionTicks != 21 || c.HeartbeatTicks != 3 {
		t.Errorf("timing %v × %d, heartbeat %d; want 7ms × 21, 3", c.TickInterval, c.ElectionTicks, c.HeartbeatTicks)
	}
	// LEASED_CONFIG_FILE names the file as well.
	if o, err := parse(t, nil, env("LEASED_CONFIG_FILE", path)); err != nil || o.cfg.Limits.MaxLeases != 123 {
		t.Errorf("LEASED_CONFIG_FILE: max leases %d, err %v", o.cfg.Limits.MaxLeases, err)
	}
	defaults, _ := parse(t, nil, nil)
	if o, err := parse(t, []string{"--config-file=" + writeConfig(t, "# nothing set yet\n")}, nil); err != nil || !reflect.DeepEqual(o.cfg, defaults.cfg) {
		t.Errorf("an empty file: %v, config %+v", err, o.cfg)
	}
}

// The command line wins over the environment, which wins over the file; a list flag given on the command
// line replaces the file's list instead of adding to it.
func TestCommandLineAndEnvironmentWinOverTheFile(t *testing.T) {
	path := writeConfig(t, `
name: from-file
max-leases: 5
max-watchers: 9
peer-cert-allowed-cn: a
`)
	o, err := parse(t, []string{"--config-file", path, "--max-leases=6", "--peer-cert-allowed-cn=b"}, env("LEASED_MAX_WATCHERS", "7"))
	if err != nil {
		t.Fatal(err)
	}
	if o.cfg.Limits.MaxLeases != 6 || o.cfg.Limits.MaxWatchers != 7 || o.cfg.Name != "from-file" {
		t.Errorf("max leases %d (want 6, the flag), max watchers %d (want 7, the variable), name %q (want the file's)",
			o.cfg.Limits.MaxLeases, o.cfg.Limits.MaxWatchers, o.cfg.Name)
	}
	if !reflect.DeepEqual(o.tls.peerAllowedCNs, []string{"b"}) {
		t.Errorf("peer CNs %v, want [b]", o.tls.peerAllowedCNs)
	}
}

func TestBadConfigFilesAreUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       []string // in the message, besides the file's path
	}{
		{"unknown key", "max-leasez: 5\n", []string{"line 1", `unknown key "max-leasez"`}},
		{"key with dashes", "--max-leases: 5\n", []string{`unknown key "--max-leases"`}},
		{"not a flag of the file", "max-ttl: 1h\nversion: true\n", []string{"line 2", `key "version"`, "command-line flag only"}},
		{"nested config file", "config-file: other.yaml\n", []string{`key "config-file"`}},
		{"wrong type", "max-leases: lots\n", []string{"max-leases", `invalid value "lots"`}},
		{"duration without unit", "max-connection-idle: 30\n", []string{"max-connection-idle", `"30"`}},
		{"bad enum", "log-level: loud\n", []string{"log-level", "debug, info, warn or error"}},
		{"list value", "join: [a:1, b:2]\n", []string{"join", "want one value"}},
		{"no value", "max-leases:\n", []string{"max-leases", "want one value"}},
		{"key twice", "max-leases: 1\nmax-leases: 2\n", []string{"line 2", `"max-leases" is already set on line 1`}},
		{"not a mapping", "- max-leases\n", []string{"want a mapping"}},
		{"two documents", "max-leases: 1\n---\nmax-leases: 2\n", []string{"one YAML document"}},
		{"not YAML", "max-leases: [\n", []string{"yaml"}},
		// Overridden on the command line, a bad value is still refused: the file is right or refused whole.
		{"bad but overridden", "max-watchers: many\n", []string{"max-watchers"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeConfig(t, tc.text)
			_, err := parse(t, []string{"--config-file=" + path, "--max-watchers=3"}, nil)
			var ue usageError
			if !errors.As(err, &ue) {
				t.Fatalf("got %v, want a usage error", err)
			}
			for _, want := range append(tc.want, "config file "+path) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
			var stderr bytes.Buffer
			if code := exitCode(err, &stderr); code != 2 || strings.Count(stderr.String(), "\n") != 1 {
				t.Errorf("exit code %d, %q; want 2 and one line", code, stderr.String())
			}
		})
	}
	if _, err := parse(t, []string{"--config-file=" + filepath.Join(t.TempDir(), "missing.yaml")}, nil); !errors.As(err, new(usageError)) ||
		!strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("a missing file: %v, want a usage error naming it", err)
	}
}

// A bad file stops leased before it touches anything: the data dir is not even created.
func TestBadConfigFileChangesNothing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	path := writeConfig(t, "max-leases: 100\nmax-leasez: 5\n")
	args := []string{"--name=n1", "--data-dir=" + dir, "--admin-addr=", "--initial-cluster=n1=127.0.0.1:7201", "--config-file=" + path}
	var stderr bytes.Buffer
	if code := exitCode(run(context.Background(), args, env(), &bytes.Buffer{}, &bytes.Buffer{}), &stderr); code != 2 ||
		!strings.Contains(stderr.String(), "max-leasez") {
		t.Errorf("exit %d, %q; want 2 naming the key", code, stderr.String())
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the data dir exists after a refused config file: %v", err)
	}
}

// --election-timeout sets the tick to a tenth of it (the default 10 election ticks, 1 heartbeat tick); a
// file's election-ticks changes the granularity but not the timeout; --tick is its alternative.
func TestElectionTimeoutSetsTheTiming(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		args       []string
		tick       time.Duration
		election   int
	}{
		{"default", "", nil, 100 * time.Millisecond, 10},
		{"2s", "", []string{"--election-timeout=2s"}, 200 * time.Millisecond, 10},
		{"finer ticks from the file", "election-ticks: 20\n", []string{"--election-timeout=2s"}, 100 * time.Millisecond, 20},
		{"both in the file", "election-timeout: 500ms\nelection-ticks: 25\n", nil, 20 * time.Millisecond, 25},
		{"command line over the file", "election-timeout: 3s\n", []string{"--election-timeout=300ms"}, 30 * time.Millisecond, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if tc.file != "" {
				args = append(args, "--config-file="+writeConfig(t, tc.file))
			}
			o, err := parse(t, args, nil)
			if err != nil {
				t.Fatal(err)
			}
			c := o.cfg
			if c.TickInterval != tc.tick || c.ElectionTicks != tc.election || c.HeartbeatTicks != 1 {
				t.Errorf("tick %v × %d, heartbeat %d; want %v × %d, 1", c.TickInterval, c.ElectionTicks, c.HeartbeatTicks, tc.tick, tc.election)
			}
			if want := 8 * time.Duration(tc.election) * tc.tick; c.TTLFloor() != want {
				t.Errorf("TTL floor %v, want %v (8 election timeouts)", c.TTLFloor(), want)
			}
		})
	}
	for args, want := range map[string]string{
		"--election-timeout=1s --config-file=" + writeConfig(t, "tick: 50ms\n"): "--election-timeout and --tick both set the raft tick",
		"--election-timeout=5ms": "a tick of 500µs: want at least 1ms",
	} {
		_, err := parse(t, strings.Fields(args), nil)
		if !errors.As(err, new(usageError)) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want a usage error saying %q", args, err, want)
		}
	}
}
