package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// --insecure-gossip lets unencrypted gossip listen beyond loopback (here every interface), and the node
// says so at start.
func TestInsecureGossipIsWarned(t *testing.T) {
	skipShort(t)
	addrs := freeAddrs(t, 2)
	peer, gossip := addrs[0], addrs[1]
	_, port, _ := net.SplitHostPort(gossip)
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	stderr := &syncBuffer{}
	args := []string{
		"--name=solo", "--data-dir=" + filepath.Join(t.TempDir(), "solo"), "--client-addr=127.0.0.1:0",
		"--peer-addr=" + peer, "--admin-addr=", "--initial-cluster=solo=" + peer, "--election-timeout=50ms",
		"--gossip-addr=0.0.0.0:" + port, "--advertise-gossip-addr=" + gossip, "--insecure-gossip",
	}
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, env(), &bytes.Buffer{}, stderr) }()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(stderr.String(), `msg="node started"`) {
		select {
		case err := <-done:
			t.Fatalf("run returned early: %v\n%s", err, stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no start after 10s:\n%s", stderr.String())
		}
	}
	if !strings.Contains(stderr.String(), "gossip is unencrypted on a non-loopback address (--insecure-gossip)") {
		t.Errorf("no warning for unencrypted gossip on every interface:\n%s", stderr.String())
	}
	cancel(errors.New("test stop"))
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("clean shutdown returned %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("run did not return after cancel")
	}
}
