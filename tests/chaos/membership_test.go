package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/leased/leased/client"
)

// The membership nemesis (runConfig.Membership, LEASED_CHAOS_MEMBERSHIP=1): replace a follower in place.
// It is killed, removed with MemberRemove, its data dir wiped, added again under a new name at the same
// peer address (through the fault proxy, so every other nemesis still reaches it) and started with
// --initial-cluster-state existing; the nemesis waits until the leader has promoted it. On five nodes
// (LEASED_CHAOS_NODES=5) it also shrinks the cluster to three and grows it back the same way. The node
// indexes stay, so every checker sees the same processes; what changes is who they are. A step runs to
// its end even when the workload's time is up (nothing may stay removed when the checkers run).

// replaceTimeout bounds one replacement: removal, add, catch-up and promotion.
const replaceTimeout = 45 * time.Second

// replaceNode replaces node i (a follower); the k-th replacement names it <base>-r<k>.
func (r *run) replaceNode(ctx context.Context, cl *client.Client, i, k int) error {
	ctx, cancel := context.WithTimeout(ctx, replaceTimeout)
	defer cancel()
	if err := r.removeNode(ctx, cl, i); err != nil {
		return err
	}
	return r.addFresh(ctx, cl, i, k)
}

// removeNode kills node i and removes it from the cluster.
func (r *run) removeNode(ctx context.Context, cl *client.Client, i int) error {
	n := r.c.Nodes[i]
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
	r.removed[i] = true
	// A retry of a removal whose first answer was lost finds the member gone: NotFound is success here.
	if _, err := cl.MemberRemove(ctx, id); err != nil && !errors.Is(err, client.ErrNotFound) {
		return fmt.Errorf("remove %s: %w", n.Name, err)
	}
	return nil
}

// addFresh wipes node i's data dir, adds it under a new name (<base>-r<k>) at its old, proxied peer
// address, starts it with --initial-cluster-state existing and waits until the leader promoted it.
func (r *run) addFresh(ctx context.Context, cl *client.Client, i, k int) error {
	n := r.c.Nodes[i]
	if err := os.RemoveAll(n.DataDir); err != nil {
		return err
	}
	base, _, _ := strings.Cut(n.Name, "-")
	name := fmt.Sprintf("%s-r%d", base, k)
	_, port, _ := net.SplitHostPort(n.PeerAddr)
	peer := net.JoinHostPort(peerHost(i), port) // how the others dial it: through the proxy
	if _, err := cl.MemberAdd(ctx, name, peer, n.ClientAddr); err != nil && !r.isMember(ctx, cl, name) {
		return fmt.Errorf("add %s: %w", name, err) // (a retry whose first attempt added it is refused)
	}
	var current []string
	for j, o := range r.c.Nodes {
		if j != i && !r.removed[j] {
			_, p, _ := net.SplitHostPort(o.PeerAddr)
			current = append(current, o.Name+"="+net.JoinHostPort(peerHost(j), p))
		}
	}
	n.Name = name // only the nemesis goroutine touches Name during the run
	n.InitialCluster = strings.Join(current, ",")
	n.Args = []string{"--initial-cluster-state=existing"}
	delete(r.removed, i)
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

// isMember reports whether the member table lists name.
func (r *run) isMember(ctx context.Context, cl *client.Client, name string) bool {
	ms, err := cl.MemberList(ctx)
	return err == nil && slices.ContainsFunc(ms, func(m client.Member) bool { return m.Name == name })
}

// membershipClient is an SDK client for the membership steps, with room for a change to apply under
// faults (the workload clients' one-second request timeout is too short for it).
func (r *run) membershipClient() *client.Client {
	c, err := client.New(client.Config{Endpoints: r.c.Endpoints(), Holder: "membership-nemesis",
		DialTimeout: time.Second, RequestTimeout: 15 * time.Second, TLS: r.c.tls.clientTLS()})
	if err != nil {
		panic(err) // only on a bad config
	}
	return c
}

// membershipNemesis runs one membership step: on five nodes, half the time a shrink to three (two
// followers killed and removed) held for a while and a grow back to five (both added fresh, one at a
// time); otherwise the replacement of one random follower. k numbers the new names.
func (r *run) membershipNemesis(rng *rand.Rand, ld int, k *int) {
	if ld < 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*replaceTimeout)
	defer cancel()
	cl := r.membershipClient()
	defer cl.Close()
	if r.removed == nil {
		r.removed = map[int]bool{}
	}
	size := len(r.c.Nodes)
	pick := func(not ...int) int {
		for {
			i := rng.IntN(size)
			if !slices.Contains(not, i) {
				return i
			}
		}
	}
	if size == 5 && rng.IntN(2) == 0 {
		a := pick(ld)
		b := pick(ld, a)
		id := r.faultStart("shrink-5-to-3-and-grow", a, b)
		err := r.removeNode(ctx, cl, a)
		if err == nil {
			err = r.removeNode(ctx, cl, b)
		}
		sleepCtx(ctx, time.Duration(1000+rng.IntN(2000))*time.Millisecond) // serve on three for a while
		for _, i := range []int{a, b} {
			if err == nil {
				*k++
				err = r.addFresh(ctx, cl, i, *k)
			}
		}
		if err != nil {
			r.t.Errorf("membership nemesis: shrink and grow: %v", err)
		}
		r.endStep(ctx, cl, id, err, a, b)
		return
	}
	i := pick(ld)
	*k++
	id := r.faultStart("replace-node", i)
	err := r.replaceNode(ctx, cl, i, *k)
	if err != nil {
		r.t.Errorf("membership nemesis: replace %s: %v", r.c.Nodes[i].Name, err)
	}
	r.endStep(ctx, cl, id, err, i)
}

// endStep ends a membership step's fault. A step that failed may leave a node out of the voters (a
// learner never promoted, a removal not followed by an add): the fault then lasts until each of its
// nodes votes again, or to the end of the run if that does not happen within the step's time, so the L1
// checker never counts a window with too few voters as a healthy majority (it counts processes).
func (r *run) endStep(ctx context.Context, cl *client.Client, id int, err error, nodes ...int) {
	voting := err == nil
	for !voting && ctx.Err() == nil {
		if voting = r.allVote(ctx, cl, nodes); !voting {
			sleepCtx(ctx, 200*time.Millisecond) // poll: a late promotion
		}
	}
	if !voting {
		r.mu.Lock()
		r.nemLog[id].Note = "step failed; its nodes count as impaired to the end of the run"
		r.mu.Unlock()
		return
	}
	r.faultEnd(id)
}

// allVote reports whether every one of nodes (under its current name) is a voter in the member table.
func (r *run) allVote(ctx context.Context, cl *client.Client, nodes []int) bool {
	ms, err := cl.MemberList(ctx)
	if err != nil {
		return false
	}
	for _, i := range nodes {
		if !slices.ContainsFunc(ms, func(m client.Member) bool { return m.Name == r.c.Nodes[i].Name && !m.IsLearner }) {
			return false
		}
	}
	return true
}
