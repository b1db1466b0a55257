package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/leased/leased/client"
)

// defaultEndpoints is the local three-node cluster (cmd/leased's defaults).
const defaultEndpoints = "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103"

// endpointsEnv overrides the default endpoints; --endpoints overrides it. Every global flag has such a
// variable: envName.
const endpointsEnv = "LEASECTL_ENDPOINTS"

// envName is the environment variable of a global flag: LEASECTL_ and the flag's name in upper case,
// dashes as underscores (--endpoints: LEASECTL_ENDPOINTS). A flag given on the command line wins.
func envName(flag string) string {
	return "LEASECTL_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// app is one leasectl invocation: its streams, its global flags and what they resolved to.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	// signals subscribes to process signals; stop unsubscribes. Tests may replace it.
	signals func(sig ...os.Signal) (ch <-chan os.Signal, stop func())

	// ran is set when a command body starts: an error before that is a usage error.
	ran bool

	// Global flags.
	endpointsFlag     string
	timeout           time.Duration
	output            string
	cacert, cert, key string
	endpoints         []string
	tlsConfig         *tls.Config
	outMu             sync.Mutex // stdout is written from stream callbacks too
	errMu             sync.Mutex // and stderr from the wait feedback (warnf)
	// now is the clock of watch's timestamps; nil is time.Now.
	now func() time.Time
}

func osSignals(sig ...os.Signal) (<-chan os.Signal, func()) {
	ch := make(chan os.Signal, 4)
	signal.Notify(ch, sig...)
	return ch, func() { signal.Stop(ch) }
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "leasectl",
		Short: "Take, hold and inspect leases on a leased cluster",
		Long: `leasectl talks to a leased cluster: it takes, renews and releases leases, reads and watches them,
runs a command while holding a lease (run) or while leading an election (elect), and shows the cluster's
state. Data goes to stdout (a table, or one JSON object per line with -o json); diagnostics go to stderr.

Exit codes: 0 ok, 1 error, 2 usage, 3 held by someone else / precondition failed,
4 not found or token no longer current, 5 cluster unavailable or timed out,
6 not authenticated or not permitted (TLS handshake failure, Unauthenticated, PermissionDenied),
7 outcome unknown.`,
		Example: `  leasectl acquire jobs/report --ttl 30s
  leasectl get jobs/report -o json
  LEASECTL_ENDPOINTS=10.0.0.1:7101 leasectl status`,
		SilenceUsage:      true,
		SilenceErrors:     true,
		PersistentPreRunE: a.resolveGlobals,
		// Without RunE a root called with no command prints its help, like every other help request.
	}
	root.SetIn(a.stdin)
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return &usageError{err: err, cmd: cmd.CommandPath()}
	})

	pf := root.PersistentFlags()
	pf.StringVar(&a.endpointsFlag, "endpoints", defaultEndpoints,
		"comma-separated client addresses of cluster nodes: host:port, or http://host:port and https://host:port (https: TLS)")
	pf.DurationVar(&a.timeout, "timeout", 5*time.Second, "time limit for each request, e.g. 500ms, 10s, 1m")
	pf.StringVarP(&a.output, "output", "o", "table", "output format: table or json (one object per line)")
	pf.StringVar(&a.cacert, "cacert", "", "PEM file of CA certificates to verify servers with (enables TLS)")
	pf.StringVar(&a.cert, "cert", "", "PEM client certificate for mutual TLS (with --key; enables TLS)")
	pf.StringVar(&a.key, "key", "", "PEM private key of --cert")
	pf.VisitAll(func(f *pflag.Flag) { f.Usage += "; env " + envName(f.Name) })
	_ = root.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"table", "json"}, cobra.ShellCompDirectiveNoFileComp))

	root.AddCommand(
		a.acquireCommand(), a.renewCommand(), a.releaseCommand(), a.getCommand(), a.listCommand(),
		a.watchCommand(), a.runCommand(), a.electCommand(), a.leaderCommand(), a.statusCommand(),
		a.memberCommand(), a.snapshotCommand(), a.aclCommand(), a.benchCommand(), a.versionCommand(),
	)
	// Cobra's own commands get examples too.
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		switch c.Name() {
		case "help":
			c.Example = "  leasectl help run"
			a.helpExitsTwoOnUnknownTopic(root, c)
		case "completion":
			c.Example = "  source <(leasectl completion bash)\n  leasectl completion zsh > \"${fpath[1]}/_leasectl\""
			var shells []string
			for _, sh := range c.Commands() {
				sh.Example = "  leasectl completion " + sh.Name() + " > leasectl-completion." + sh.Name()
				shells = append(shells, sh.Name())
			}
			// Without this cobra prints the help for "completion tcsh" and exits 0.
			c.Args = func(cmd *cobra.Command, args []string) error {
				if len(args) > 0 {
					return usagef(cmd, "unsupported shell %q (want %s)", args[0], strings.Join(shells, ", "))
				}
				return usagef(cmd, "missing shell (%s)", strings.Join(shells, ", "))
			}
			c.RunE = func(*cobra.Command, []string) error { return nil }
		}
	}
	return root
}

// helpExitsTwoOnUnknownTopic makes "leasectl help bogus" a usage error (cobra prints "Unknown help topic"
// and exits 0).
func (a *app) helpExitsTwoOnUnknownTopic(root, help *cobra.Command) {
	show := help.Run
	help.Run = nil
	help.RunE = func(cmd *cobra.Command, args []string) error {
		if target, rest, err := root.Find(args); err != nil || target == nil || len(rest) > 0 {
			return usagef(cmd, "unknown help topic %q", strings.Join(args, " "))
		}
		show(cmd, args)
		return nil
	}
}

// resolveGlobals validates the global flags before any command body runs, so a bad value is a usage error
// that never touches the network. A global flag not given takes its environment variable (envName).
func (a *app) resolveGlobals(cmd *cobra.Command, _ []string) error {
	if err := a.globalsFromEnv(cmd.Root().PersistentFlags()); err != nil {
		return usagef(cmd, "%v", err)
	}
	if a.output != "table" && a.output != "json" {
		return usagef(cmd, "invalid -o %q: want table or json", a.output)
	}
	if a.timeout <= 0 {
		return usagef(cmd, "--timeout must be positive, got %v", a.timeout)
	}
	eps, scheme, err := parseEndpointURLs(a.endpointsFlag)
	if err != nil {
		return usagef(cmd, "%v", err)
	}
	a.endpoints = eps
	if scheme == "http" && (a.cacert != "" || a.cert != "") {
		return usagef(cmd, "--endpoints http:// is plaintext, but --cacert or --cert asks for TLS: use https:// (or host:port)")
	}
	cfg, err := loadTLS(a.cacert, a.cert, a.key)
	if err != nil {
		return usagef(cmd, "%v", err)
	}
	if cfg == nil && scheme == "https" {
		cfg = &tls.Config{MinVersion: tls.VersionTLS12} // the system's roots verify the servers
	}
	a.tlsConfig = cfg
	return nil
}

// globalsFromEnv sets every global flag that was not given from its environment variable, if set.
func (a *app) globalsFromEnv(flags *pflag.FlagSet) error {
	var errs []error
	flags.VisitAll(func(f *pflag.Flag) {
		v := strings.TrimSpace(a.getenv(envName(f.Name)))
		if f.Changed || v == "" {
			return
		}
		if err := f.Value.Set(v); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: %v", envName(f.Name), v, err))
		}
	})
	return errors.Join(errs...)
}

// parseEndpointURLs parses --endpoints: host:port, or URLs as etcdctl takes them (http://host:port,
// https://host:port; the scheme is stripped, and https asks for TLS). scheme is "http" or "https" when
// URLs were given (all with the same scheme), else "".
func parseEndpointURLs(raw string) (eps []string, scheme string, err error) {
	var addrs []string
	for _, ep := range strings.Split(raw, ",") {
		ep = strings.TrimSpace(ep)
		if ep == "" {
			continue
		}
		s, addr, ok := strings.Cut(ep, "://")
		if !ok {
			addrs = append(addrs, ep)
			if scheme != "" {
				return nil, "", fmt.Errorf("invalid endpoint %q: give every endpoint as a %s:// URL, or none", ep, scheme)
			}
			continue
		}
		if s != "http" && s != "https" {
			return nil, "", fmt.Errorf("invalid endpoint %q: the scheme must be http:// or https://", ep)
		}
		if (scheme != "" && s != scheme) || (scheme == "" && len(addrs) > 0) {
			return nil, "", fmt.Errorf("invalid endpoint %q: mixes http://, https:// and host:port endpoints", ep)
		}
		scheme = s
		if addr = strings.TrimSuffix(addr, "/"); strings.ContainsAny(addr, "/?#@") {
			return nil, "", fmt.Errorf("invalid endpoint %q: want %s://host:port without a path", ep, s)
		}
		addrs = append(addrs, addr)
	}
	eps, err = parseEndpoints(strings.Join(addrs, ","))
	return eps, scheme, err
}

// parseEndpoints parses comma-separated host:port addresses.
func parseEndpoints(raw string) ([]string, error) {
	var out []string
	for _, ep := range strings.Split(raw, ",") {
		ep = strings.TrimSpace(ep)
		if ep == "" {
			continue
		}
		host, port, err := net.SplitHostPort(ep)
		if err != nil {
			return nil, fmt.Errorf("invalid endpoint %q: want host:port", ep)
		}
		if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 || host == "" {
			return nil, fmt.Errorf("invalid endpoint %q: want host:port", ep)
		}
		out = append(out, ep)
	}
	if len(out) == 0 {
		return nil, errors.New("no endpoints given")
	}
	return out, nil
}

// loadTLS builds the client TLS configuration from the TLS flags; nil when none is set.
func loadTLS(cacert, cert, key string) (*tls.Config, error) {
	if cacert == "" && cert == "" && key == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if cacert != "" {
		pem, err := os.ReadFile(cacert)
		if err != nil {
			return nil, fmt.Errorf("--cacert: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--cacert: no PEM certificate in %s", cacert)
		}
		cfg.RootCAs = pool
	}
	if (cert == "") != (key == "") {
		return nil, errors.New("--cert and --key must be given together")
	}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("--cert/--key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// body wraps a command body: from here on an error is the command's, not a usage error.
func (a *app) body(fn func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		a.ran = true
		return fn(cmd, args)
	}
}

// newClient returns an SDK client for the resolved endpoints. holder may be empty (the SDK default).
func (a *app) newClient(endpoints []string, holder string) (*client.Client, error) {
	return client.New(client.Config{
		Endpoints: endpoints, TLS: a.tlsConfig, Holder: holder,
		DialTimeout: a.timeout, RequestTimeout: a.timeout,
	})
}

// withClient runs fn with a client that is closed afterwards.
func (a *app) withClient(holder string, fn func(c *client.Client) error) error {
	c, err := a.newClient(a.endpoints, holder)
	if err != nil {
		return err
	}
	defer c.Close()
	return fn(c)
}

// withReadClient is withClient for reads that report a lease's remaining time. Only the leader knows it
// (followers answer 0), and the SDK sends reads to the first endpoint until a write names the leader, so
// the endpoints are first asked who leads (Status needs no leader) and the leader is put first.
func (a *app) withReadClient(ctx context.Context, fn func(c *client.Client) error) error {
	eps := a.endpoints
	if len(eps) > 1 {
		if leader := a.findLeader(ctx); leader != "" {
			eps = append([]string{leader}, without(eps, leader)...)
		}
	}
	c, err := a.newClient(eps, "")
	if err != nil {
		return err
	}
	defer c.Close()
	return fn(c)
}

// findLeader asks every endpoint in parallel who leads and returns the first leader address named, or ""
// when none is known before ctx ends.
func (a *app) findLeader(ctx context.Context) string {
	c, err := a.newClient(a.endpoints, "")
	if err != nil {
		return ""
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	found := make(chan string, len(a.endpoints))
	for _, ep := range a.endpoints {
		go func() {
			st, err := c.Status(ctx, ep)
			if err != nil {
				found <- ""
				return
			}
			found <- st.GetHeader().GetLeaderAddr()
		}()
	}
	leader := ""
	for range a.endpoints {
		if addr := <-found; addr != "" && leader == "" {
			leader = addr
			cancel() // the rest answer quickly now
		}
	}
	return leader
}

func without(list []string, s string) []string {
	var out []string
	for _, v := range list {
		if v != s {
			out = append(out, v)
		}
	}
	return out
}

// requestContext bounds one request by --timeout.
func (a *app) requestContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, a.timeout)
}

// interruptible returns a context cancelled when leasectl receives SIGINT or SIGTERM; interrupted reports
// afterwards whether that happened.
func (a *app) interruptible(ctx context.Context) (context.Context, func() bool, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	sigs, stop := a.signals(os.Interrupt, syscall.SIGTERM)
	var mu sync.Mutex
	interrupted := false
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-sigs:
			mu.Lock()
			interrupted = true
			mu.Unlock()
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return interrupted
		}, func() {
			stop()
			cancel()
			<-done
		}
}

func (a *app) jsonOut() bool { return a.output == "json" }

// warnf prints a diagnostic to stderr. Safe for concurrent use (the wait feedback prints from its own
// goroutine).
func (a *app) warnf(format string, args ...any) {
	a.errMu.Lock()
	defer a.errMu.Unlock()
	fmt.Fprintf(a.stderr, "leasectl: "+format+"\n", args...)
}

// defaultHolder names leases taken by acquire without --holder. Without a request id it is host:pid, like
// the SDK's default (and run's and elect's): two acquires from one host are told apart, and "held by"
// names the process. With --request-id it is the host name alone, stable across invocations, so that a
// retry from a new process is recognised (the server scopes request ids to the holder).
func defaultHolder(withRequestID bool) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "leasectl"
	}
	if withRequestID {
		return host
	}
	return fmt.Sprintf("%s:%d", host, os.Getpid())
}
