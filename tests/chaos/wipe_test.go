package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"time"

	"github.com/leased/leased/client"
)

// The wipe nemesis (runConfig.Wipe, LEASED_CHAOS_WIPE=1, make chaos WIPE=1): a node loses its volume and
// is started again with the flags it last started with, as a StatefulSet does after a lost volume. It is
// killed, its data dir removed, and it starts again with --auto-rejoin: it must come back as a voter under
// a new raft id (the cluster retires its old one), having caught up, while every checker holds — nothing
// acknowledged is lost (I3) and no token is issued twice (I1/I2). The fault lasts until the node votes
// again under its new id, bounded by wipeTimeout.

// wipeTimeout bounds one wipe: the rejoin (the leader must first stop hearing from the old id), catch-up
// and promotion.
const wipeTimeout = 45 * time.Second

// wipeNemesis wipes the leader ld half of the time, a follower otherwise.
func (r *run) wipeNemesis(ctx context.Context, rng *rand.Rand, ld int) {
	if ld < 0 {
		return
	}
	i, name := ld, "wipe-leader"
	if rng.IntN(2) == 0 {
		i, name = (ld+1+rng.IntN(len(r.c.Nodes)-1))%len(r.c.Nodes), "wipe-follower"
	}
	cl := r.membershipClient()
	defer cl.Close()
	wctx, cancel := context.WithTimeout(context.Background(), wipeTimeout) // runs to its end past the workload's time
	defer cancel()
	oldID, err := r.memberID(wctx, cl, r.c.Nodes[i].Name)
	if err != nil {
		r.t.Logf("wipe nemesis: skipped: %v", err)
		return
	}
	id := r.faultStart(name, i)
	err = r.wipeAndRestart(wctx, cl, i, oldID)
	if err != nil {
		r.t.Errorf("wipe nemesis: %s: %v", r.c.Nodes[i].Name, err)
		r.mu.Lock()
		r.nemLog[id].Note = "wipe failed; its node counts as impaired to the end of the run"
		r.mu.Unlock()
		return
	}
	r.faultEnd(id)
}

// wipeAndRestart kills node i, removes its data dir, starts it with --auto-rejoin and waits until the
// member table shows it a voter under an id other than oldID.
func (r *run) wipeAndRestart(ctx context.Context, cl *client.Client, i int, oldID uint64) error {
	n := r.c.Nodes[i]
	r.c.Kill(i)
	if err := os.RemoveAll(n.DataDir); err != nil {
		return err
	}
	if !slices.Contains(n.Args, "--auto-rejoin") {
		n.Args = append(n.Args, "--auto-rejoin") // only the nemesis goroutine touches Args during the run
	}
	r.c.Start(i)
	for ctx.Err() == nil {
		if !r.c.Running(i) {
			return fmt.Errorf("exited after the wipe (its log says why: %s)", n.LogPath)
		}
		if ms, err := cl.MemberList(ctx); err == nil {
			for _, m := range ms {
				if m.Name == n.Name && m.ID != oldID && !m.IsLearner {
					return nil
				}
			}
		}
		sleepCtx(ctx, 200*time.Millisecond) // poll: the node is rejoining and catching up
	}
	return fmt.Errorf("not a voter under a new raft id within %v", wipeTimeout)
}

// memberID is the raft id of the member called name.
func (r *run) memberID(ctx context.Context, cl *client.Client, name string) (uint64, error) {
	ms, err := cl.MemberList(ctx)
	if err != nil {
		return 0, fmt.Errorf("member list: %w", err)
	}
	for _, m := range ms {
		if m.Name == name {
			return m.ID, nil
		}
	}
	return 0, fmt.Errorf("%s is not in the member table %v", name, ms)
}
