package main

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/leased/leased/client"
)

// Feedback while waiting: acquire --wait, run --wait and elect would otherwise sit silent until granted.
// While one of them waits, a watcher on the same client reads who holds the resource and follows its
// grants, printing one stderr line when the wait starts and one at every change of holder:
//
//	leasectl: waiting for jobs/a: held by host-1:4242, token 17, 7.9s left
//
// It only reads (Get and Watch); the waiting call itself is untouched.

// reportWaiting starts the watcher for resource, ignoring grants to self (this invocation's holder). The
// returned stop ends it and waits for it; call it as soon as the wait ends, before printing anything else.
func (a *app) reportWaiting(ctx context.Context, c *client.Client, resource, self string) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { a.followHolders(ctx, c, resource, self) })
	return func() {
		cancel()
		wg.Wait()
	}
}

// followHolders prints the holder now (if another) and every later grant to another, until ctx ends.
// Errors end the feedback silently: the waiting call reports the cluster's problems itself.
func (a *app) followHolders(ctx context.Context, c *client.Client, resource, self string) {
	var from uint64 // 0: from now
	info, err := c.Get(ctx, resource)
	switch {
	case err == nil:
		from = info.Token + 1
		if info.Holder != self {
			a.waitingLine(ctx, resource, info.Holder, info.Token, info.Remaining)
		}
	case !errors.Is(err, client.ErrNotFound):
		return
	}
	_ = c.Watch(ctx, client.WatchOptions{Resource: resource, FromIndex: from}, func(e client.Event) error {
		if e.Type == client.Granted && e.Lease.Holder != self {
			a.waitingLine(ctx, resource, e.Lease.Holder, e.Lease.Token, e.Lease.TTL) // a fresh grant: all of its TTL left
		}
		return nil
	})
}

// waitingLine prints one line of feedback unless the wait is over (ctx ended: the grant may be ours).
// left is the leader's view of the time left (0 when a follower answered: then it is not printed).
func (a *app) waitingLine(ctx context.Context, resource, holder string, token uint64, left time.Duration) {
	if ctx.Err() != nil {
		return
	}
	remaining := ""
	if left > 0 {
		remaining = ", " + roughly(left) + " left"
	}
	a.warnf("waiting for %s: held by %s, token %d%s", resource, holder, token, remaining)
}

// roughly formats a time left for people: tenths of a second from 1s up ("7.9s"), else milliseconds.
func roughly(d time.Duration) string {
	if d >= time.Second {
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String()
}
