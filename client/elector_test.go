package client_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/leased/leased/client"
	"github.com/leased/leased/server/servertest"
)

// termLog records the terms of competing electors: it fails the test if two overlap or if a term's
// token is not above every earlier one.
type termLog struct {
	t       *testing.T
	mu      sync.Mutex
	leading string // the candidate leading now, "" when none
	tokens  []uint64
	started map[string]int
	stopped map[string]int
	leaders []client.LeaderInfo // as observed by OnNewLeader
}

func newTermLog(t *testing.T) *termLog {
	return &termLog{t: t, started: map[string]int{}, stopped: map[string]int{}}
}

func (g *termLog) callbacks(name string) client.LeaderCallbacks {
	return client.LeaderCallbacks{
		OnStartedLeading: func(ctx context.Context, l *client.Lease) {
			g.mu.Lock()
			if g.leading != "" {
				g.t.Errorf("%s leads (token %d) while %s still does", name, l.Token(), g.leading)
			}
			if n := len(g.tokens); n > 0 && l.Token() <= g.tokens[n-1] {
				g.t.Errorf("%s's term has token %d, not above the previous term's %d", name, l.Token(), g.tokens[n-1])
			}
			g.leading, g.tokens = name, append(g.tokens, l.Token())
			g.started[name]++
			g.mu.Unlock()
			<-ctx.Done()
			g.mu.Lock()
			g.leading = ""
			g.mu.Unlock()
		},
		OnStoppedLeading: func() {
			g.mu.Lock()
			g.stopped[name]++
			g.mu.Unlock()
		},
		OnNewLeader: func(li client.LeaderInfo) {
			g.mu.Lock()
			g.leaders = append(g.leaders, li)
			g.mu.Unlock()
		},
	}
}

// waitFor polls cond under the log's lock, bounded by d.
func (g *termLog) waitFor(what string, d time.Duration, cond func() bool) {
	g.t.Helper()
	deadline := time.Now().Add(d)
	for {
		g.mu.Lock()
		ok := cond()
		g.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			g.t.Fatalf("not within %v: %s", d, what)
		}
		<-time.After(20 * time.Millisecond) // poll interval
	}
}

// TestElectorAcrossLeaderKill: two candidates; the raft leader node is killed while one leads. One of
// them keeps or regains leadership, never two at once, and every term's token is above the last. When
// the leader's Run is cancelled it releases, and the other takes over at once.
func TestElectorAcrossLeaderKill(t *testing.T) {
	cl := servertest.Start(t, 3, nil)
	log := newTermLog(t)
	ctx := ctxT(t)
	runs := map[string]context.CancelFunc{}
	var wg sync.WaitGroup
	for _, name := range []string{"a", "b"} {
		c := newClient(t, cl.Endpoints(), func(cfg *client.Config) { cfg.Holder = name })
		e, err := c.NewElector(client.ElectorConfig{Resource: "svc/scheduler", Value: []byte(name), TTL: 2 * time.Second,
			RetryPeriod: 100 * time.Millisecond, Callbacks: log.callbacks(name)})
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		runs[name] = cancel
		wg.Go(func() {
			if err := e.Run(rctx); !errors.Is(err, context.Canceled) {
				t.Errorf("%s: Run returned %v", name, err)
			}
		})
	}
	defer func() {
		for _, cancel := range runs {
			cancel()
		}
		wg.Wait()
	}()
	log.waitFor("a first leader", 10*time.Second, func() bool { return log.leading != "" })

	cl.Stop(cl.WaitLeader())
	cl.WaitLeader()
	// Across more than a TTL after the kill, someone leads, in a term whose token is the largest so far.
	settle := time.Now().Add(4 * time.Second)
	log.waitFor("a leader after the kill", 15*time.Second, func() bool { return log.leading != "" && time.Now().After(settle) })

	log.mu.Lock()
	first, termsBefore := log.leading, len(log.tokens)
	log.mu.Unlock()
	other := map[string]string{"a": "b", "b": "a"}[first]
	runs[first]() // resign: the other takes over without waiting a TTL
	log.waitFor(other+" leads after "+first+" resigned", 5*time.Second, func() bool {
		return log.leading == other && len(log.tokens) > termsBefore
	})
	log.waitFor(first+" stopped leading", 5*time.Second, func() bool { return log.stopped[first] == log.started[first] })
	// The observer saw the new term (OnNewLeader is reported from a watch, so it may trail a little).
	log.waitFor("OnNewLeader reports "+other, 5*time.Second, func() bool {
		n := len(log.leaders)
		return n > 0 && string(log.leaders[n-1].Value) == other && log.leaders[n-1].Token == log.tokens[len(log.tokens)-1]
	})
}

// TestElectorProclaim: the leader changes its value; observers see it under the same token.
func TestElectorProclaim(t *testing.T) {
	cl := servertest.Start(t, 3, nil)
	log := newTermLog(t)
	ctx := ctxT(t)
	c := newClient(t, cl.Endpoints(), nil)
	e, err := c.NewElector(client.ElectorConfig{Resource: "svc/api", Value: []byte("10.0.0.1:80"), Callbacks: log.callbacks("a")})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Proclaim(ctx, []byte("x")); !errors.Is(err, client.ErrNotLeading) {
		t.Fatalf("proclaim before leading: %v", err)
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = e.Run(rctx) })
	defer func() { cancel(); wg.Wait() }()
	log.waitFor("leading", 10*time.Second, func() bool { return log.leading == "a" && len(log.leaders) == 1 })
	if err := e.Proclaim(ctx, []byte("10.0.0.9:80")); err != nil {
		t.Fatal(err)
	}
	log.waitFor("the proclaimed value observed", 5*time.Second, func() bool { return len(log.leaders) == 2 })
	log.mu.Lock()
	before, after := log.leaders[0], log.leaders[1]
	log.mu.Unlock()
	if after.Token != before.Token || string(after.Value) != "10.0.0.9:80" || e.Leading().Token() != before.Token {
		t.Fatalf("observed %+v then %+v", before, after)
	}
	cancel()
	wg.Wait()
	if _, err := c.Get(ctx, "svc/api"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("the lease was not released on cancel: %v", err)
	}
}
