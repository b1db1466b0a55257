// Command leased runs one node of a leased cluster: the Raft-replicated lease state machine, the gRPC
// Leases and Cluster services for clients, raft traffic for peers, and a small admin HTTP server.
//
// Flags (each also settable as LEASED_<FLAG_IN_UPPER_SNAKE> and in the YAML --config-file, except
// --version and --help-all) become a server.Config; `leased --help` lists the essential ones, `leased
// --help-all` every one. `leased health` asks a running node's admin port whether it is ready
// (health.go), for container health checks. SIGTERM or SIGINT shuts the node down cleanly (it hands leadership to a follower first) and
// exits 0. Exit status 1 is a configuration error or a fatal error of the node, 2 a bad flag.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/leased/leased/cmd/internal/buildinfo"
	"github.com/leased/leased/server"
)

func main() {
	// The context ends on the first SIGTERM or SIGINT. Later signals are swallowed while the node shuts
	// down (a supervisor that sends SIGTERM after the terminal's SIGINT must not cut the shutdown short);
	// SIGKILL remains the way to stop it at once.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(err, os.Stderr))
}

// exitCode is the one place errors become exit statuses: 0 for success and --help, 2 for a bad command
// line, 1 for anything else. It prints the error, on one line for a bad flag.
func exitCode(err error, stderr io.Writer) int {
	var ue usageError
	switch {
	case err == nil, errors.Is(err, errHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "leased: %v (see leased --help)\n", ue.err)
		return 2
	default:
		// One line, so that the reason stays together in logs (errors.Join separates with newlines).
		fmt.Fprintf(stderr, "leased: %s\n", strings.ReplaceAll(err.Error(), "\n", "; "))
		return 1
	}
}

// run parses the command line, starts the node and serves until ctx ends (a clean shutdown: nil) or the
// node stops by itself after a fatal error (that error).
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "health" {
		return runHealth(ctx, args[1:], getenv, stdout, stderr)
	}
	o, err := parseFlags(args, getenv, stdout)
	if err != nil {
		return err
	}
	build := buildinfo.Read()
	if o.showVersion {
		fmt.Fprintf(stdout, "leased %s\n", build)
		return nil
	}
	if o.gossipKeyFile != "" {
		text, err := os.ReadFile(o.gossipKeyFile)
		if err != nil {
			return fmt.Errorf("gossip key: %w", err)
		}
		if o.cfg.GossipKey, err = server.ParseGossipKey(text); err != nil {
			return fmt.Errorf("gossip key %s: %w", o.gossipKeyFile, err)
		}
	}
	version := build.Version
	log := newLogger(o, stderr)
	limitToContainer(log, memlimit.FromCgroup)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	o.cfg.Logger, o.cfg.Version, o.cfg.Registerer = log, version, reg
	audit, closeAudit, err := openAuditLog(o)
	if err != nil {
		return err
	}
	defer closeAudit()
	o.cfg.AuditLog = audit
	certs, err := buildTLS(o.tls, log)
	if err != nil {
		return err
	}
	o.cfg.ClientTLS, o.cfg.ClientCertAuth, o.cfg.PeerTLS = certs.client, o.tls.clientCertAuth, certs.peer
	o.cfg.InsecurePeer = o.tls.insecurePeer
	o.cfg.PeerCertAllowedCNs, o.cfg.PeerCertAllowedHostnames = o.tls.peerAllowedCNs, o.tls.peerAllowedHosts

	// Bind the admin listener first: a port in use is reported before the data dir is opened.
	admin, err := listenAdmin(o.adminAddr, log, reg, certs.admin, o.tls.enablePprof)
	if err != nil {
		return err
	}
	srv, err := server.New(o.cfg, server.Listeners{})
	if err != nil {
		admin.close()
		return err
	}
	log.Info("leased starting", "version", version, "name", o.cfg.Name, "data_dir", o.cfg.DataDir,
		"client_addr", srv.ClientAddr(), "peer_addr", srv.PeerAddr(), "http_addr", srv.HTTPAddr(), "admin_addr", admin.addr(),
		"client_tls", certs.client != nil, "client_cert_auth", o.cfg.ClientCertAuth, "peer_tls", certs.peer != nil,
		"admin_tls", certs.admin != nil, "pprof", o.tls.enablePprof,
		"initial_cluster", formatCluster(o.cfg.InitialCluster), "election_timeout", o.cfg.ElectionTimeout(), "gogc", gcPercent(),
		"memory_limit", formatLimit(debug.SetMemoryLimit(-1)))
	srv.Start()
	admin.serve(srv)

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down", "cause", context.Cause(ctx))
	case <-srv.Done():
		runErr = srv.Err()
		if runErr == nil {
			runErr = errors.New("raft loop ended unexpectedly")
		}
		runErr = fmt.Errorf("node stopped: %w", runErr)
	case err := <-admin.errc:
		runErr = err
		log.Error("shutting down", "err", err)
	}
	admin.setStopping() // /readyz answers 503 while the node drains
	closeErr := closeServer(srv, runErr != nil)
	admin.close()
	if closeErr != nil {
		closeErr = fmt.Errorf("shutdown: %w", closeErr)
		log.Error("shutdown failed", "err", closeErr)
	} else if runErr == nil {
		log.Info("stopped")
	}
	return errors.Join(runErr, closeErr)
}

// failedCloseGrace bounds the shutdown of a node that stopped on a fatal error: a raft log write stalled
// beyond --disk-stall-timeout may never return, and Close waits for it, but the process must still exit
// (fail-stop: the healthy majority moves on without it).
const failedCloseGrace = 5 * time.Second

// closeServer closes srv; after a fatal error it gives up waiting after failedCloseGrace.
func closeServer(srv *server.Server, failed bool) error {
	if !failed {
		return srv.Close()
	}
	done := make(chan error, 1)
	go func() { done <- srv.Close() }()
	timer := time.NewTimer(failedCloseGrace)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-timer.C:
		return fmt.Errorf("gave up closing the node after %v (a raft log write is still blocked)", failedCloseGrace)
	}
}

// formatLimit is the memory limit for the log: "none" when the runtime has none.
func formatLimit(limit int64) string {
	if limit == math.MaxInt64 {
		return "none"
	}
	return strconv.FormatInt(limit, 10)
}
