//go:build faultinject

package main

import (
	"fmt"
	"net/http"
	"syscall"
	"time"
)

// Fault hooks for the multi-process chaos harness, compiled only with -tags faultinject (never in a
// release build):
//
//	POST /debug/fault/disk-stall?duration=3s
//	    the node's next raft log write blocks for duration before it writes (the writes after it wait
//	    behind it); a stall longer than --disk-stall-timeout stops the node with exit status 1.
//	    200 with a one-line text body; 400 if duration is missing, unparsable (time.ParseDuration) or
//	    not positive.
//
//	POST /debug/fault/disk-error?errno=ENOSPC
//	    the node's next raft log write fails with errno (EIO or ENOSPC) without writing, as on a failing
//	    or full disk; the node stops with exit status 1, its log naming the error and the file.
//	    200 with a one-line text body; 400 for any other errno.

// diskStaller is what the disk-stall hook asks of the node (server.Server built with -tags faultinject).
type diskStaller interface {
	InjectDiskStall(d time.Duration)
}

// diskErrorer is what the disk-error hook asks of the node (server.Server built with -tags faultinject).
type diskErrorer interface {
	InjectDiskError(errno syscall.Errno)
}

// injectableErrnos are the errors the disk-error hook injects, by name.
var injectableErrnos = map[string]syscall.Errno{"EIO": syscall.EIO, "ENOSPC": syscall.ENOSPC}

func registerFaults(mux *http.ServeMux, node leaderKnower) {
	if de, ok := node.(diskErrorer); ok {
		mux.HandleFunc("POST /debug/fault/disk-error", func(w http.ResponseWriter, r *http.Request) {
			q := r.URL.Query().Get("errno")
			e, ok := injectableErrnos[q]
			if !ok {
				http.Error(w, fmt.Sprintf("errno=%q: want EIO or ENOSPC", q), http.StatusBadRequest)
				return
			}
			de.InjectDiskError(e)
			fmt.Fprintf(w, "ok: the next raft log write fails with %s (%v)\n", q, e)
		})
	}
	ds, ok := node.(diskStaller)
	if !ok {
		return
	}
	mux.HandleFunc("POST /debug/fault/disk-stall", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query().Get("duration")
		d, err := time.ParseDuration(q)
		if err != nil || d <= 0 {
			http.Error(w, fmt.Sprintf("duration=%q: want a positive Go duration such as 3s", q), http.StatusBadRequest)
			return
		}
		ds.InjectDiskStall(d)
		fmt.Fprintf(w, "ok: the next raft log write stalls for %v\n", d)
	})
}
