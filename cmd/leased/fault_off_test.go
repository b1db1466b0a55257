//go:build !faultinject

package main

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestNoFaultHooksInANormalBuild: without -tags faultinject the admin server has no /debug/fault route,
// even for a node that could stall its disk.
func TestNoFaultHooksInANormalBuild(t *testing.T) {
	node := &stallingNode{}
	srv := httptest.NewServer((&adminServer{}).handler(node))
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/debug/fault/disk-stall?duration=3s", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || node.stall != 0 {
		t.Fatalf("POST /debug/fault/disk-stall in a normal build: %d, stall %v; want 404 and none", resp.StatusCode, node.stall)
	}
}

type stallingNode struct {
	fakeNode
	stall time.Duration
}

func (n *stallingNode) InjectDiskStall(d time.Duration) { n.stall = d }
