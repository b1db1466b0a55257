package client

import (
	"testing"
	"time"
)

// An endpoint that did not answer in time is skipped for 1s, doubling with each further failure up to
// 30s, then tried again; an answer clears it; if it was the preferred node the leader is unknown again.
func TestUnresponsiveEndpointsAreSkippedWithBackoffAndRetriedLater(t *testing.T) {
	c, err := New(Config{Endpoints: []string{"a:1", "b:1", "c:1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.endpoints.leader = "a:1"
	for i, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second} {
		before := time.Now()
		c.endpoints.unresponsive("a:1")
		h := c.endpoints.health["a:1"]
		if got := h.until.Sub(before); got < want || got > want+time.Second {
			t.Fatalf("failure %d: skipped for %v, want %v", i+1, got, want)
		}
	}
	if c.endpoints.leader != "" {
		t.Fatalf("an unresponsive preferred node stays preferred: %q", c.endpoints.leader)
	}
	now := time.Now()
	c.endpoints.mu.Lock()
	for range 6 {
		if ep := c.endpoints.nextLocked(now); ep == "a:1" {
			t.Fatal("round robin picked the unresponsive endpoint")
		}
	}
	// Once its backoff ends it is tried again.
	h := c.endpoints.health["a:1"]
	h.until = now.Add(-time.Millisecond)
	c.endpoints.health["a:1"] = h
	if c.endpoints.unresponsiveLocked("a:1", now) {
		t.Fatal("still skipped after its backoff ended")
	}
	c.endpoints.mu.Unlock()
	c.endpoints.unresponsive("b:1")
	c.endpoints.responsive("b:1")
	if _, ok := c.endpoints.health["b:1"]; ok {
		t.Fatal("an answer did not clear the endpoint's failures")
	}
	// When every endpoint is unresponsive, one is tried anyway.
	for _, ep := range c.cfg.Endpoints {
		c.endpoints.unresponsive(ep)
	}
	c.endpoints.mu.Lock()
	defer c.endpoints.mu.Unlock()
	if ep := c.endpoints.nextLocked(time.Now()); ep == "" {
		t.Fatal("no endpoint to try")
	}
}
