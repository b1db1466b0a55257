package main

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/leased/leased/server/servertest/testcerts"
)

// Bad certificate flags are configuration errors (exit 1) that name the flags, found before any port
// or data dir is opened.
func TestTLSFlagErrorsExitOne(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "ca")
	cert, key := ca.Node(t, "n1").Write(t, dir, "n1")
	caFile := ca.WriteCA(t, dir, "ca.crt")
	missing := filepath.Join(dir, "missing.crt")
	base := []string{"--name=n1", "--data-dir=" + filepath.Join(dir, "data"), "--admin-addr=", "--initial-cluster=n1=127.0.0.1:7201"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--cert-file=" + missing, "--key-file=" + key}, "client TLS (--cert-file"},
		{[]string{"--cert-file=" + cert}, "--cert-file and --key-file go together"},
		{[]string{"--client-cert-auth"}, "--client-cert-auth needs --cert-file, --key-file and --trusted-ca-file"},
		{[]string{"--cert-file=" + cert, "--key-file=" + key, "--client-cert-auth"}, "--client-cert-auth needs"},
		{[]string{"--peer-cert-file=" + cert, "--peer-key-file=" + key}, "needs --peer-trusted-ca-file"},
		{[]string{"--peer-cert-file=" + cert, "--peer-key-file=" + key, "--peer-trusted-ca-file=" + missing}, "peer TLS (--peer-cert-file"},
		{[]string{"--admin-cert-file=" + key, "--admin-key-file=" + key}, "admin TLS"},
		{[]string{"--peer-addr=0.0.0.0:7201"}, "--insecure-peer"},
		{[]string{"--trusted-ca-file=" + caFile}, "only used with --client-cert-auth"},
		{[]string{"--peer-cert-allowed-cn=n1"}, "--peer-cert-allowed-cn and --peer-cert-allowed-hostname need peer TLS"},
		{[]string{"--gossip-addr=10.0.0.1:7301"}, "--insecure-gossip"},
	} {
		err := run(context.Background(), append(append([]string{}, base...), tc.args...), env(), &bytes.Buffer{}, &bytes.Buffer{})
		var stderr bytes.Buffer
		if code := exitCode(err, &stderr); code != 1 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, %q; want 1 and %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}

func TestTLSFlagsFromEnvironment(t *testing.T) {
	o, err := parseFlags(nil, env("LEASED_CERT_FILE", "/c", "LEASED_KEY_FILE", "/k", "LEASED_TRUSTED_CA_FILE", "/ca",
		"LEASED_CLIENT_CERT_AUTH", "true", "LEASED_PEER_CERT_FILE", "/pc", "LEASED_PEER_KEY_FILE", "/pk",
		"LEASED_PEER_TRUSTED_CA_FILE", "/pca", "LEASED_INSECURE_PEER", "true", "LEASED_ADMIN_CERT_FILE", "/ac",
		"LEASED_ADMIN_KEY_FILE", "/ak", "LEASED_ENABLE_PPROF", "true", "LEASED_PEER_CERT_ALLOWED_CN", "n1,n2",
		"LEASED_PEER_CERT_ALLOWED_HOSTNAME", "peers.example"), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	want := tlsOptions{certFile: "/c", keyFile: "/k", caFile: "/ca", clientCertAuth: true, peerCertFile: "/pc",
		peerKeyFile: "/pk", peerCA: "/pca", insecurePeer: true, adminCertFile: "/ac", adminKeyFile: "/ak", enablePprof: true,
		peerAllowedCNs: []string{"n1", "n2"}, peerAllowedHosts: []string{"peers.example"}}
	if !reflect.DeepEqual(o.tls, want) {
		t.Fatalf("tls options %+v, want %+v", o.tls, want)
	}
}

func TestPprofOnlyWhenEnabled(t *testing.T) {
	for _, enabled := range []bool{false, true} {
		a := &adminServer{pprof: enabled}
		srv := httptest.NewServer(a.handler(&fakeNode{}))
		resp, err := http.Get(srv.URL + "/debug/pprof/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		srv.Close()
		if got := resp.StatusCode == http.StatusOK; got != enabled {
			t.Errorf("--enable-pprof=%v: /debug/pprof/ answered %d", enabled, resp.StatusCode)
		}
	}
}

// The peer and client ports trusting one CA file is the set-up in which a client certificate could be
// issued with a member's name: the node says so at start, and not when each has its own CA.
func TestSharedPeerAndClientCAWarned(t *testing.T) {
	dir := t.TempDir()
	ca, peerCA := testcerts.NewCA(t, "ca"), testcerts.NewCA(t, "peer-ca")
	cert, key := ca.Node(t, "n1").Write(t, dir, "n1")
	peerCert, peerKey := peerCA.Node(t, "n1").Write(t, dir, "n1-peer")
	caFile, peerCAFile := ca.WriteCA(t, dir, "ca.crt"), peerCA.WriteCA(t, dir, "peer-ca.crt")
	copyFile := ca.WriteCA(t, dir, "ca-copy.crt")
	for _, tc := range []struct {
		name   string
		peer   tlsOptions
		warned bool
	}{
		{"one file", tlsOptions{peerCertFile: cert, peerKeyFile: key, peerCA: caFile}, true},
		{"a copy of it", tlsOptions{peerCertFile: cert, peerKeyFile: key, peerCA: copyFile}, true},
		{"a CA of its own", tlsOptions{peerCertFile: peerCert, peerKeyFile: peerKey, peerCA: peerCAFile}, false},
	} {
		o := tc.peer
		o.certFile, o.keyFile, o.caFile, o.clientCertAuth = cert, key, caFile, true
		var logs bytes.Buffer
		if _, err := buildTLS(o, slog.New(slog.NewTextHandler(&logs, nil))); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := strings.Contains(logs.String(), "are the same file"); got != tc.warned {
			t.Errorf("%s: warned %v, want %v; logs: %s", tc.name, got, tc.warned, logs.String())
		}
	}
}
