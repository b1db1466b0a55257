package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// runHealth is `leased health`: it asks a node's admin HTTP server whether the node is ready (/readyz,
// the default) or alive (/healthz with --live) and returns nil only on a 200. It is a health check that
// needs nothing but the leased binary (distroless images have no shell or curl). The admin address
// comes from --admin-addr or LEASED_ADMIN_ADDR, as for the node itself, so a container's one environment
// serves both; an unspecified host (0.0.0.0, [::]) is asked on loopback.
func runHealth(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("leased health", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	addr := fs.String("admin-addr", "127.0.0.1:7401", "host:port of the node's admin HTTP server [$LEASED_ADMIN_ADDR]")
	live := fs.Bool("live", false, "ask /healthz (the process serves) instead of /readyz (the node knows a leader)")
	timeout := fs.Duration("timeout", 2*time.Second, "how long to wait for the answer")
	if v := getenv(envName("admin-addr")); v != "" {
		*addr = v
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printHealthUsage(stdout, fs)
			return errHelp
		}
		return usageError{dashDash(err)}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("leased health: unexpected argument %q", fs.Arg(0))}
	}
	if *timeout <= 0 {
		return usageError{errors.New("leased health: --timeout must be positive")}
	}
	target, err := dialable(*addr)
	if err != nil {
		return usageError{fmt.Errorf("leased health: --admin-addr: %w", err)}
	}
	path := "/readyz"
	if *live {
		path = "/healthz"
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	body, err := getStatus(ctx, "http://"+target+path)
	if err != nil {
		return fmt.Errorf("health: %s: %w", path, err)
	}
	fmt.Fprintf(stdout, "%s: %s\n", path, body)
	return nil
}

// dialable turns a listen address into one to connect to: an unspecified host becomes loopback.
func dialable(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("%q: want host:port", addr)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port), nil
}

// getStatus GETs url and returns its body's first line on a 200, an error naming the status otherwise.
func getStatus(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	line := strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0])
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", resp.Status, line)
	}
	return line, nil
}

func printHealthUsage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprint(w, `leased health asks a running node's admin HTTP server whether it is ready, for container and
orchestrator health checks (it needs no shell or curl).

Usage:
  leased health [--admin-addr HOST:PORT] [--live] [--timeout D]

Flags:
`)
	fs.VisitAll(func(f *flag.Flag) {
		fmt.Fprintf(w, "  --%s\n    \t%s (default %s)\n", f.Name, f.Usage, f.DefValue)
	})
	fmt.Fprint(w, `
Exit status: 0 when the node answers 200 (ready, or alive with --live); 1 when it answers otherwise or
not at all (the reason on stderr); 2 on a bad flag.
`)
}
