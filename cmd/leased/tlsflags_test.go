package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
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
		"LEASED_ADMIN_KEY_FILE", "/ak", "LEASED_ENABLE_PPROF", "true"), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	want := tlsOptions{certFile: "/c", keyFile: "/k", caFile: "/ca", clientCertAuth: true, peerCertFile: "/pc",
		peerKeyFile: "/pk", peerCA: "/pca", insecurePeer: true, adminCertFile: "/ac", adminKeyFile: "/ak", enablePprof: true}
	if o.tls != want {
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
