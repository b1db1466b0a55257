package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/leased/leased/api/leasepb"
)

// adminServer is the node's small HTTP server for operators and orchestrators:
//
//	/healthz  200 while the process runs
//	/readyz   200 when the node is ready: it knows a leader and its raft loop runs (it can serve requests);
//	          503 with the reason otherwise (no leader, "raft loop stalled for 1.2s: ..." while a disk write
//	          blocks it, stopped) and while stopping. It never waits for the raft loop or the disk;
//	          a second line "alarm: NOSPACE ..." while the state is at --quota-bytes (still 200: renewals,
//	          releases and reads are served, and a probe must not take every node out of service at once)
//	/metrics  Prometheus metrics (leased_*, plus the Go runtime's and the process's)
//	/debug/pprof/  Go's profiler, only with --enable-pprof
//
// It serves plaintext on loopback by default (--admin-addr); with --admin-cert-file and --admin-key-file
// it serves HTTPS (TLS 1.2+, the certificate re-read when its files change). It has no authentication:
// anyone who reaches it can read the metrics and, with --enable-pprof, profile the process.
//
// Built with -tags faultinject it also serves fault hooks for the chaos harness (fault.go).
type adminServer struct {
	lis      net.Listener // nil: disabled
	metrics  prometheus.Gatherer
	srv      *http.Server
	log      *slog.Logger
	tls      *tls.Config // nil: plaintext
	pprof    bool
	stopping atomic.Bool
	done     chan struct{}
	errc     chan error // at most one error from Serve; never closed
}

// leaderKnower is what the admin server asks of the node.
type leaderKnower interface {
	Leader() uint64
}

// readier is a node that says whether it can serve and, if not, why (server.Server does); a node that
// is not one is ready while it knows a leader.
type readier interface {
	Ready() error
}

// notReady is why node cannot serve (nil: it can), by the rule of readier.
func notReady(node leaderKnower, leader uint64) error {
	if r, ok := node.(readier); ok {
		return r.Ready()
	}
	if leader == 0 {
		return errors.New("no leader")
	}
	return nil
}

// quotaReporter is a node that reports its state size against its quota (server.Server does).
type quotaReporter interface {
	Quota() (used, quota int64)
}

func listenAdmin(addr string, log *slog.Logger, metrics prometheus.Gatherer, tlsCfg *tls.Config, pprof bool) (*adminServer, error) {
	a := &adminServer{log: log, metrics: metrics, tls: tlsCfg, pprof: pprof, done: make(chan struct{}), errc: make(chan error, 1)}
	if addr == "" {
		close(a.done)
		return a, nil
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for admin http: %w", err)
	}
	if tlsCfg != nil {
		lis = tls.NewListener(lis, tlsCfg)
	}
	a.lis = lis
	return a, nil
}

func (a *adminServer) addr() string {
	if a.lis == nil {
		return ""
	}
	return a.lis.Addr().String()
}

// handler serves the admin endpoints for node.
func (a *adminServer) handler(node leaderKnower) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		leader := node.Leader()
		switch err := notReady(node, leader); {
		case a.stopping.Load():
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
		case err != nil:
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		default:
			fmt.Fprintf(w, "ok: leader %s\n", leasepb.FormatID(leader))
			if q, ok := node.(quotaReporter); ok {
				if used, quota := q.Quota(); used >= quota {
					fmt.Fprintf(w, "alarm: NOSPACE: the state holds %d bytes, at its quota of %d (--quota-bytes): new grants are refused until leases are released or the quota is raised\n", used, quota)
				}
			}
		}
	})
	if a.metrics != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(a.metrics, promhttp.HandlerOpts{}))
	}
	if a.pprof {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	registerFaults(mux, node)
	return mux
}

// serve starts serving in the background; a failure arrives on errc.
func (a *adminServer) serve(node leaderKnower) {
	if a.lis == nil {
		return
	}
	a.srv = &http.Server{Handler: a.handler(node), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		defer close(a.done)
		if err := a.srv.Serve(a.lis); !errors.Is(err, http.ErrServerClosed) {
			a.errc <- fmt.Errorf("admin http: %w", err)
		}
	}()
}

func (a *adminServer) setStopping() { a.stopping.Store(true) }

// close stops the server (or the unserved listener) and waits for it.
func (a *adminServer) close() {
	if a.lis == nil {
		return
	}
	if a.srv == nil {
		_ = a.lis.Close()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := a.srv.Shutdown(ctx); err != nil {
		_ = a.srv.Close()
	}
	<-a.done
}
