package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"time"

	"github.com/leased/leased/client"
)

// The membership nemesis (runConfig.Membership, LEASED_CHAOS_MEMBERSHIP=1): replace a follower in place.
// It is killed, removed with MemberRemove, its data dir wiped, added again under a new name at the same
// peer address (through the fault proxy, so every other nemesis still reaches it) and started with
// --initial-cluster-state existing; the nemesis waits until the leader has promoted it. The cluster keeps
// its size and node indexes, so every checker sees the same nodes; what changes is who they are.

// replaceTimeout bounds one replacement: removal, add, catch-up and promotion.
const replaceTimeout = 45 * time.Second

// replaceNode replaces node i (a follower); the k-th replacement names it <base>-r<k>.
func (r *run) replaceNode(ctx context.Context, cl *client.Client, i, k int) error {
	n := r.c.Nodes[i]
	ctx, cancel := context.WithTimeout(ctx, replaceTimeout)
	defer cancel()
	members, err := cl.MemberList(ctx)
	if err != nil {
		return fmt.Errorf("member list: %w", err)
	}
	var id uint64
	for _, m := range members {
		if m.Name == n.Name {
			id = m.ID
		}
	}
	if id == 0 {
		return fmt.Errorf("%s is not in the member table %v", n.Name, members)
	}
	r.c.Kill(i)
	if _, err := cl.MemberRemove(ctx, id); err != nil {
		return fmt.Errorf("remove %s: %w", n.Name, err)
	}
	if err := os.RemoveAll(n.DataDir); err != nil {
		return err
	}
	base, _, _ := strings.Cut(n.Name, "-")
	name := fmt.Sprintf("%s-r%d", base, k)
	_, port, _ := net.SplitHostPort(n.PeerAddr)
	peer := net.JoinHostPort(peerHost(i), port) // how the others dial it: through the proxy
	if _, err := cl.MemberAdd(ctx, name, peer, n.ClientAddr); err != nil {
		return fmt.Errorf("add %s: %w", name, err)
	}
	var current []string
	for j, o := range r.c.Nodes {
		if j != i {
			_, p, _ := net.SplitHostPort(o.PeerAddr)
			current = append(current, o.Name+"="+net.JoinHostPort(peerHost(j), p))
		}
	}
	n.Name = name // only the nemesis goroutine touches Name during the run
	n.InitialCluster = strings.Join(current, ",")
	n.Args = []string{"--initial-cluster-state=existing"}
	r.c.Start(i)
	for ctx.Err() == nil {
		if ms, err := cl.MemberList(ctx); err == nil {
			for _, m := range ms {
				if m.Name == name && !m.IsLearner {
					return nil
				}
			}
		}
		sleepCtx(ctx, 200*time.Millisecond) // poll: the new member is catching up
	}
	return fmt.Errorf("%s not promoted within %v", name, replaceTimeout)
}

// membershipNemesis runs one replacement of a random follower as a nemesis step.
func (r *run) membershipNemesis(ctx context.Context, rng *rand.Rand, ld, k int) {
	if ld < 0 {
		return
	}
	i := (ld + 1 + rng.IntN(len(r.c.Nodes)-1)) % len(r.c.Nodes)
	cl := r.newClient("membership-nemesis", nil)
	defer cl.Close()
	id := r.faultStart("replace-node", i)
	if err := r.replaceNode(ctx, cl, i, k); err != nil {
		r.t.Errorf("membership nemesis: replace %s: %v", r.c.Nodes[i].Name, err)
	}
	r.faultEnd(id)
}
