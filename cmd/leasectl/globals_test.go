package main

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/leased/leased/client"
	"github.com/leased/leased/server/servertest/testcerts"
)

// Every global flag has a LEASECTL_* variable that sets it when the flag is not given. The table names
// each flag: a new global flag without a row fails here, and so does one whose variable has no effect.
func TestEveryGlobalFlagHasAnEnvironmentVariable(t *testing.T) {
	ca := testcerts.NewCA(t, "ca")
	dir := t.TempDir()
	caFile := ca.WriteCA(t, dir, "ca.crt")
	certFile, keyFile := ca.Client(t, "alice").Write(t, dir, "alice")
	rows := map[string]struct {
		value string
		// also are variables set alongside (a flag that needs another, like --cert and --key).
		also  map[string]string
		check func(a *app) bool
	}{
		"endpoints": {"http://10.0.0.1:7101", nil, func(a *app) bool { return len(a.endpoints) == 1 && a.endpoints[0] == "10.0.0.1:7101" }},
		"timeout":   {"7s", nil, func(a *app) bool { return a.timeout == 7*time.Second }},
		"output":    {"json", nil, func(a *app) bool { return a.output == "json" }},
		"cacert":    {caFile, nil, func(a *app) bool { return a.tlsConfig != nil && a.tlsConfig.RootCAs != nil }},
		"cert": {certFile, map[string]string{"LEASECTL_KEY": keyFile}, func(a *app) bool {
			return a.tlsConfig != nil && len(a.tlsConfig.Certificates) == 1
		}},
		"key": {keyFile, map[string]string{"LEASECTL_CERT": certFile}, func(a *app) bool {
			return a.tlsConfig != nil && len(a.tlsConfig.Certificates) == 1
		}},
	}
	root := (&app{getenv: func(string) string { return "" }, signals: osSignals}).rootCommand()
	root.PersistentFlags().VisitAll(func(f *pflag.Flag) {
		row, ok := rows[f.Name]
		if !ok {
			t.Errorf("global flag --%s has no row here: give it a %s variable and test it", f.Name, envName(f.Name))
			return
		}
		if !strings.Contains(f.Usage, "env "+envName(f.Name)) {
			t.Errorf("--%s's help does not name %s: %q", f.Name, envName(f.Name), f.Usage)
		}
		env := map[string]string{envName(f.Name): row.value}
		for k, v := range row.also {
			env[k] = v
		}
		a := &app{getenv: func(k string) string { return env[k] }, signals: osSignals}
		cmd := a.rootCommand()
		if err := a.resolveGlobals(cmd, nil); err != nil {
			t.Errorf("%s=%s: %v", envName(f.Name), row.value, err)
			return
		}
		if !row.check(a) {
			t.Errorf("%s=%s did not set --%s", envName(f.Name), row.value, f.Name)
		}
	})
	// A flag given on the command line wins over its variable; a bad value in a variable is a usage error
	// that names it.
	t.Setenv("LEASECTL_TIMEOUT", "soon")
	r := inProcess("--endpoints", dead, "get", "x")
	if r.code != exitUsage || !strings.Contains(r.stderr, "LEASECTL_TIMEOUT") {
		t.Errorf("bad LEASECTL_TIMEOUT: %v", r)
	}
	r = inProcess("--endpoints", dead, "--timeout", "200ms", "get", "x")
	if r.code != exitUnavailable {
		t.Errorf("--timeout did not win over LEASECTL_TIMEOUT: %v", r)
	}
}

func TestEndpointURLs(t *testing.T) {
	for _, c := range []struct {
		raw, scheme string
		want        []string
	}{
		{"127.0.0.1:7101", "", []string{"127.0.0.1:7101"}},
		{"http://127.0.0.1:7101,http://127.0.0.1:7102/", "http", []string{"127.0.0.1:7101", "127.0.0.1:7102"}},
		{"https://leased-1.example:7101", "https", []string{"leased-1.example:7101"}},
		{"http://[::1]:7101", "http", []string{"[::1]:7101"}},
	} {
		got, scheme, err := parseEndpointURLs(c.raw)
		if err != nil || scheme != c.scheme || strings.Join(got, ",") != strings.Join(c.want, ",") {
			t.Errorf("parseEndpointURLs(%q) = %v, %q, %v; want %v, %q", c.raw, got, scheme, err, c.want, c.scheme)
		}
	}
	for _, bad := range []string{
		"ftp://h:1", "http://h", "http://h:1/v3", "http://h:1?x=1", "http://u@h:1",
		"http://h:1,https://h:2", "h:1,http://h:2", "http://h:1,h:2",
	} {
		if eps, _, err := parseEndpointURLs(bad); err == nil {
			t.Errorf("parseEndpointURLs(%q) = %v, want an error", bad, eps)
		}
	}
	// https:// asks for TLS (the system's roots without --cacert); http:// with TLS flags is refused.
	a := &app{getenv: func(string) string { return "" }, signals: osSignals}
	cmd := a.rootCommand()
	a.endpointsFlag = "https://127.0.0.1:7101"
	if err := a.resolveGlobals(cmd, nil); err != nil || a.tlsConfig == nil {
		t.Fatalf("https:// endpoint: tls %v, err %v", a.tlsConfig, err)
	}
	r := inProcess("--endpoints", "http://127.0.0.1:1", "--cacert", os.DevNull, "get", "x")
	if r.code != exitUsage || !strings.Contains(r.stderr, "use https://") {
		t.Fatalf("http:// with --cacert: %v", r)
	}
}

func TestLimitsInFlagUnits(t *testing.T) {
	for _, c := range []struct {
		err  *client.InvalidError
		want string
	}{
		{&client.InvalidError{Field: "ttl_ms", Bounded: true, Value: 100, Limit: 8000, Why: "the TTL must outlast a leader failover"},
			"--ttl 100ms is below the cluster's minimum 8s (the TTL must outlast a leader failover)"},
		{&client.InvalidError{Field: "ttl_ms", Bounded: true, Value: 7_200_000, Limit: 3_600_000, Above: true},
			"--ttl 2h0m0s is above the cluster's maximum 1h0m0s"},
		{&client.InvalidError{Field: "lock_delay_ms", Bounded: true, Value: 120_000, Limit: 60_000, Above: true},
			"--lock-delay 2m0s is above the cluster's maximum 1m0s"},
	} {
		if got := message(c.err); got != c.want {
			t.Errorf("message = %q, want %q", got, c.want)
		}
		if exitCode(c.err) != exitUsage {
			t.Errorf("%v: exit %d, want 2", c.err, exitCode(c.err))
		}
	}
	// Refused before the network, in the same units.
	for args, want := range map[string]string{
		"--ttl 0s":    "--ttl 0s must be positive",
		"--ttl 500us": "--ttl 500µs is below 1ms",
	} {
		r := inProcess(append([]string{"--endpoints", dead, "acquire", "x"}, strings.Fields(args)...)...)
		if r.code != exitUsage || !strings.Contains(r.stderr, want) {
			t.Errorf("%s: want exit 2 and %q, got %v", args, want, r)
		}
	}
}

// The default holder tells processes apart (host:pid), except with --request-id, whose retries from a
// new process must match (host).
func TestDefaultHolderNamesTheProcess(t *testing.T) {
	host, _ := os.Hostname()
	if got := defaultHolder(false); !strings.HasPrefix(got, host+":") || !strings.HasSuffix(got, ":"+strconv.Itoa(os.Getpid())) {
		t.Errorf("defaultHolder(false) = %q, want %s:%d", got, host, os.Getpid())
	}
	if got := defaultHolder(true); got != host {
		t.Errorf("defaultHolder(true) = %q, want %q", got, host)
	}
}
