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

	"github.com/leased/leased/client"
)

// defaultEndpoints is the local three-node cluster (cmd/leased's defaults).
const defaultEndpoints = "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103"

// endpointsEnv overrides the default endpoints; --endpoints overrides it.
const endpointsEnv = "LEASECTL_ENDPOINTS"

// The TLS flags' environment variables; a flag overrides its variable.
const (
	cacertEnv = "LEASECTL_CACERT"
	certEnv   = "LEASECTL_CERT"
	keyEnv    = "LEASECTL_KEY"
)

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
		"comma-separated client addresses (host:port) of cluster nodes; env "+endpointsEnv)
	pf.DurationVar(&a.timeout, "timeout", 5*time.Second, "time limit for each request, e.g. 500ms, 10s, 1m")
	pf.StringVarP(&a.output, "output", "o", "table", "output format: table or json (one object per line)")
	pf.StringVar(&a.cacert, "cacert", "", "PEM file of CA certificates to verify servers with (enables TLS); env "+cacertEnv)
	pf.StringVar(&a.cert, "cert", "", "PEM client certificate for mutual TLS (with --key; enables TLS); env "+certEnv)
	pf.StringVar(&a.key, "key", "", "PEM private key of --cert; env "+keyEnv)
	_ = root.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"table", "json"}, cobra.ShellCompDirectiveNoFileComp))

	root.AddCommand(
		a.acquireCommand(), a.renewCommand(), a.releaseCommand(), a.getCommand(), a.listCommand(),
		a.watchCommand(), a.runCommand(), a.electCommand(), a.leaderCommand(), a.statusCommand(),
		a.memberCommand(), a.snapshotCommand(), a.aclCommand(), a.versionCommand(),
	)
	// Cobra's own commands get examples too.
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		switch c.Name() {
		case "help":
			c.Example = "  leasectl help run"
		case "completion":
			c.Example = "  source <(leasectl completion bash)\n  leasectl completion zsh > \"${fpath[1]}/_leasectl\""
			for _, sh := range c.Commands() {
				sh.Example = "  leasectl completion " + sh.Name() + " > leasectl-completion." + sh.Name()
			}
		}
	}
	return root
}

// resolveGlobals validates the global flags before any command body runs, so a bad value is a usage error
// that never touches the network.
func (a *app) resolveGlobals(cmd *cobra.Command, _ []string) error {
	if a.output != "table" && a.output != "json" {
		return usagef(cmd, "invalid -o %q: want table or json", a.output)
	}
	if a.timeout <= 0 {
		return usagef(cmd, "--timeout must be positive, got %v", a.timeout)
	}
	raw := a.endpointsFlag
	if !cmd.Flags().Changed("endpoints") {
		if env := strings.TrimSpace(a.getenv(endpointsEnv)); env != "" {
			raw = env
		}
	}
	eps, err := parseEndpoints(raw)
	if err != nil {
		return usagef(cmd, "%v", err)
	}
	a.endpoints = eps
	for _, f := range []struct {
		name, env string
		p         *string
	}{{"cacert", cacertEnv, &a.cacert}, {"cert", certEnv, &a.cert}, {"key", keyEnv, &a.key}} {
		if !cmd.Flags().Changed(f.name) {
			if v := strings.TrimSpace(a.getenv(f.env)); v != "" {
				*f.p = v
			}
		}
	}
	cfg, err := loadTLS(a.cacert, a.cert, a.key)
	if err != nil {
		return usagef(cmd, "%v", err)
	}
	a.tlsConfig = cfg
	return nil
}

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

// warnf prints a diagnostic to stderr.
func (a *app) warnf(format string, args ...any) {
	fmt.Fprintf(a.stderr, "leasectl: "+format+"\n", args...)
}

// defaultHolder names leases taken by acquire: the host name, stable across invocations so that a retried
// acquire with the same --request-id is recognised (the server scopes request ids to the holder).
func defaultHolder() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		return "leasectl"
	}
	return host
}
