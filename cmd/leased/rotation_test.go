package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leased/leased/server/servertest/testcerts"
)

// TestCertificateRotationWithoutRestart runs a node with TLS on its client, peer and admin ports from
// files, replaces the files, and sees new handshakes serve the new certificate (by serial) while the
// node keeps running.
func TestCertificateRotationWithoutRestart(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "ca")
	first := ca.Node(t, "solo")
	cert, key := first.Write(t, dir, "solo")
	caFile := ca.WriteCA(t, dir, "ca.crt")
	addrs := freeAddrs(t, 3)
	client, peer, admin := addrs[0], addrs[1], addrs[2]
	args := []string{
		"--name=solo", "--data-dir=" + filepath.Join(dir, "data"), "--client-addr=" + client,
		"--peer-addr=" + peer, "--admin-addr=" + admin, "--initial-cluster=solo=" + peer, "--election-timeout=50ms",
		"--cert-file=" + cert, "--key-file=" + key, "--trusted-ca-file=" + caFile, "--client-cert-auth",
		"--peer-cert-file=" + cert, "--peer-key-file=" + key, "--peer-trusted-ca-file=" + caFile,
		"--admin-cert-file=" + cert, "--admin-key-file=" + key,
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	stderr := &syncBuffer{}
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, env(), &bytes.Buffer{}, stderr) }()

	alice := ca.Client(t, "alice")
	serial := func(addr string) (string, error) {
		conn, err := tls.Dial("tcp", addr, testcerts.ClientConfig(alice, ca.Pool()))
		if err != nil {
			return "", err
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.String(), nil
	}
	waitSerial := func(addr, want string) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			got, err := serial(addr)
			if err == nil && got == want {
				return
			}
			select {
			case err := <-done:
				t.Fatalf("leased stopped: %v\n%s", err, stderr.String())
			case <-time.After(50 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s serves serial %s (%v), want %s", addr, got, err, want)
			}
		}
	}
	for _, addr := range []string{client, peer, admin} {
		waitSerial(addr, first.Cert.SerialNumber.String())
	}

	second := ca.Node(t, "solo")
	second.Write(t, dir, "solo")
	for _, addr := range []string{client, peer, admin} {
		waitSerial(addr, second.Cert.SerialNumber.String())
	}
	httpc := &http.Client{Transport: &http.Transport{TLSClientConfig: testcerts.ClientConfig(nil, ca.Pool())}}
	resp, err := httpc.Get("https://" + admin + "/healthz")
	if err != nil {
		t.Fatalf("admin over HTTPS: %v", err)
	}
	resp.Body.Close()
	if !strings.Contains(stderr.String(), "tls certificate reloaded") {
		t.Errorf("no reload logged:\n%s", stderr.String())
	}
	cancel(errors.New("test stop"))
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("shutdown: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("run did not return")
	}
}
