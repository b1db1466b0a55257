package chaos

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/leased/leased/tests/internal/proc"
)

// The disk-error nemeses (runConfig.DiskErr, LEASED_CHAOS_DISKERR=1, make chaos DISKERR=1), through the
// faultinject build's admin hooks:
//
//   - stalled-follower-disk: a follower's next raft log writes block for 1–4 s (below
//     --disk-stall-timeout). The follower must say so — /readyz 503 — while its loop is stuck, and every
//     checker must hold.
//   - full-disk: a node's (the leader's or a follower's) next raft log write fails with ENOSPC. It must
//     stop at once with exit status 1, its log naming the error (decision 13, fail-stop); it is then
//     started again on the same data dir and must rejoin, having lost nothing it acknowledged (the
//     checkers).

// diskErrExitBound is how long a node whose write failed may take to exit.
const diskErrExitBound = 10 * time.Second

// diskErrNemesis injects one of the two, on a node chosen around the leader ld.
func (r *run) diskErrNemesis(ctx context.Context, rng *rand.Rand, ld int) {
	if ld < 0 {
		return
	}
	follower := (ld + 1 + rng.IntN(len(r.c.Nodes)-1)) % len(r.c.Nodes)
	if rng.IntN(2) == 0 {
		r.stallFollowerDisk(ctx, follower, time.Second+time.Duration(rng.IntN(3000))*time.Millisecond)
		return
	}
	i, name := ld, "full-disk-leader"
	if rng.IntN(2) == 0 {
		i, name = follower, "full-disk-follower"
	}
	r.fullDisk(ctx, i, name)
}

// postFault POSTs path?query to node i's admin address; it reports whether the hook took it.
func (r *run) postFault(ctx context.Context, i int, pathQuery string) bool {
	hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(hctx, http.MethodPost, "http://"+r.c.Nodes[i].AdminAddr+pathQuery, nil)
	if err != nil {
		r.t.Logf("%s: %v", pathQuery, err)
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Logf("%s on n%d: %v", pathQuery, i+1, err)
		return false
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		r.t.Errorf("%s on n%d: %s: %s (the chaos build must have -tags faultinject)", pathQuery, i+1, resp.Status, strings.TrimSpace(string(body)))
		return false
	}
	return true
}

// stallFollowerDisk stalls follower i's next raft log write for d and polls its /readyz meanwhile.
func (r *run) stallFollowerDisk(ctx context.Context, i int, d time.Duration) {
	if !r.postFault(ctx, i, fmt.Sprintf("/debug/fault/disk-stall?duration=%v", d)) {
		return
	}
	id := r.faultStart("stalled-follower-disk", i)
	defer r.faultEnd(id)
	deadline := time.Now().Add(d)
	notReady := false
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if code, err := r.readyz(ctx, i); err == nil && code == http.StatusServiceUnavailable {
			notReady = true
		}
		sleepCtx(ctx, 50*time.Millisecond) // poll through the stall
	}
	sleepCtx(ctx, 500*time.Millisecond) // the write it delayed
	switch {
	case !r.c.Running(i):
		r.t.Errorf("stalled-follower-disk: n%d exited on a %v stall, below --disk-stall-timeout", i+1, d)
		r.c.Start(i)
	case !notReady && ctx.Err() == nil:
		r.t.Errorf("stalled-follower-disk: n%d answered /readyz 200 all through a %v disk stall", i+1, d)
	}
}

// readyz is node i's /readyz status code.
func (r *run) readyz(ctx context.Context, i int) (int, error) {
	hctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(hctx, http.MethodGet, "http://"+r.c.Nodes[i].AdminAddr+"/readyz", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// fullDisk fails node i's next raft log write with ENOSPC, checks that it exits 1 naming the error, and
// starts it again.
func (r *run) fullDisk(ctx context.Context, i int, name string) {
	if !r.postFault(ctx, i, "/debug/fault/disk-error?errno=ENOSPC") {
		return
	}
	id := r.faultStart(name, i)
	defer r.faultEnd(id)
	err := proc.Poll(diskErrExitBound, func() bool { return !r.c.Running(i) })
	if err != nil {
		// Under the workload every node writes within the bound (the leader's checkpoints alone would):
		// a node still running has carried on past a failed write.
		r.t.Errorf("%s: n%d still runs %v after its raft log write failed with ENOSPC", name, i+1, diskErrExitBound)
		r.c.Kill(i)
		r.restartAndRejoin(ctx, i)
		return
	}
	code, _ := r.c.Exited(i)
	log, _ := os.ReadFile(r.c.Nodes[i].LogPath)
	tail := string(log[strings.LastIndex(string(log), "=== start"):])
	if code != 1 || !strings.Contains(tail, "no space left on device") || !strings.Contains(tail, ".wal") {
		r.t.Errorf("%s: n%d exited %d; want 1 and its log naming ENOSPC and the WAL segment (%s)", name, i+1, code, r.c.Nodes[i].LogPath)
	}
	r.restartAndRejoin(ctx, i)
}
