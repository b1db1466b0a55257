package client_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/leased/leased/client"
	"github.com/leased/leased/server/servertest"
)

// closedPorts returns n loopback addresses that nothing listens on (each was listened on and closed).
func closedPorts(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, l.Addr().String())
		_ = l.Close()
	}
	return out
}

// repeatedPhrase returns a phrase an error message says twice in a row ("context deadline exceeded:
// context deadline exceeded"), or "".
func repeatedPhrase(msg string) string {
	parts := strings.Split(msg, ": ")
	for i := 1; i < len(parts); i++ {
		if strings.TrimSpace(parts[i]) == strings.TrimSpace(parts[i-1]) {
			return parts[i]
		}
	}
	if strings.Count(msg, "deadline exceeded") > 1 {
		return "deadline exceeded"
	}
	return ""
}

// When every endpoint refuses connections the call says so, naming each, and does not wait out its
// deadline. Before, it ended after RequestTimeout with "cluster unavailable: context deadline exceeded".
func TestRefusedEndpointsFailFastNamingTheCause(t *testing.T) {
	eps := closedPorts(t, 2)
	c := newClient(t, eps, func(cfg *client.Config) { cfg.RequestTimeout = 10 * time.Second })
	for name, op := range map[string]func() error{
		"get": func() error { _, err := c.Get(context.Background(), "x"); return err },
		"acquire": func() error {
			_, err := c.Acquire(context.Background(), "x", client.WithTTL(10*time.Second))
			return err
		},
	} {
		start := time.Now()
		err := op()
		took := time.Since(start)
		if !errors.Is(err, client.ErrUnavailable) || errors.Is(err, client.ErrOutcomeUnknown) {
			t.Fatalf("%s: %v, want ErrUnavailable", name, err)
		}
		msg := err.Error()
		for _, ep := range eps {
			if !strings.Contains(msg, ep+": connection refused") {
				t.Errorf("%s: %q does not say %s refused the connection", name, msg, ep)
			}
		}
		if strings.Contains(msg, "deadline") {
			t.Errorf("%s: %q speaks of the deadline", name, msg)
		}
		if took > 6*time.Second { // the patience is 1s; the deadline 10s
			t.Errorf("%s took %v: it waited for the deadline", name, took)
		}
	}
}

// A name that does not resolve is named, rather than a timeout.
func TestUnresolvableEndpointIsNamed(t *testing.T) {
	c := newClient(t, []string{"nosuchhost.invalid:7101"}, func(cfg *client.Config) { cfg.RequestTimeout = 3 * time.Second })
	_, err := c.Get(context.Background(), "x")
	if !errors.Is(err, client.ErrUnavailable) || !strings.Contains(err.Error(), `cannot resolve host "nosuchhost.invalid"`) {
		t.Fatalf("get: %v, want ErrUnavailable naming the name resolution", err)
	}
}

// A peer port answers gRPC, but not the client API: the error says to use the client port.
func TestPeerPortIsNamed(t *testing.T) {
	cl := servertest.Start(t, 1, nil)
	c := newClient(t, []string{cl.Node(0).PeerAddr()}, func(cfg *client.Config) { cfg.RequestTimeout = 10 * time.Second })
	start := time.Now()
	_, err := c.Get(context.Background(), "x")
	if !errors.Is(err, client.ErrNotClientPort) || !strings.Contains(err.Error(), "peer port") || !strings.Contains(err.Error(), "client port") {
		t.Fatalf("get on the peer port: %v, want ErrNotClientPort naming the peer port", err)
	}
	if strings.Contains(err.Error(), "unknown service") || time.Since(start) > 6*time.Second {
		t.Fatalf("after %v: %v", time.Since(start), err)
	}
}

// With two of three nodes down, a read names what each endpoint did, and says nothing twice. Before, it
// printed "context deadline exceeded: context deadline exceeded".
func TestQuorumLostNamesEachEndpointOnce(t *testing.T) {
	cl := servertest.Start(t, 3, nil)
	eps := cl.Endpoints()
	cl.Stop(1)
	cl.Stop(2)
	c := newClient(t, eps, func(cfg *client.Config) { cfg.RequestTimeout = 3 * time.Second })
	_, err := c.Get(context.Background(), "x")
	if !errors.Is(err, client.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("get without quorum: %v", err)
	}
	msg := err.Error()
	t.Logf("get without quorum: %s", msg)
	if p := repeatedPhrase(msg); p != "" {
		t.Errorf("%q says %q twice", msg, p)
	}
	for _, ep := range eps[1:] {
		if !strings.Contains(msg, ep+": connection refused") {
			t.Errorf("%q does not say that %s refused", msg, ep)
		}
	}
	if !strings.Contains(msg, eps[0]+": ") {
		t.Errorf("%q does not say what the live node %s answered", msg, eps[0])
	}
}

// A node that accepts the call and never answers is named as such ("no answer after ..."), not as a
// deadline.
func TestFrozenNodeIsNamed(t *testing.T) {
	_, stuckAddr := serveStuckLeader(t)
	c := newClient(t, []string{stuckAddr}, func(cfg *client.Config) { cfg.RequestTimeout = 2 * time.Second })
	_, err := c.Acquire(context.Background(), "frozen/x", client.WithTTL(10*time.Second))
	if !errors.Is(err, client.ErrUnavailable) && !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("acquire on a frozen node: %v", err)
	}
	msg := err.Error()
	// Its last attempt timed out on its own share of the call ("no answer after 667ms"), or — on a
	// loaded machine, when it started too late for a full share — on the call's deadline.
	named := strings.Contains(msg, stuckAddr+": no answer after ") || strings.Contains(msg, stuckAddr+": no answer before the call's deadline")
	if !named || strings.Count(msg, "deadline exceeded") > 1 {
		t.Fatalf("acquire on a frozen node: %q, want %s named as not answering", msg, stuckAddr)
	}
	if p := repeatedPhrase(msg); p != "" {
		t.Fatalf("%q says %q twice", msg, p)
	}
}
