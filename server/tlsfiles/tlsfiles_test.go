package tlsfiles

import (
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leased/leased/server/servertest/testcerts"
)

// servedSerial makes one handshake against cfg and returns the serial of the certificate served.
func servedSerial(t *testing.T, cfg *tls.Config, ca *testcerts.CA) string {
	t.Helper()
	srv, cli := net.Pipe()
	defer srv.Close()
	defer cli.Close()
	errc := make(chan error, 1)
	go func() { errc <- tls.Server(srv, cfg).Handshake() }()
	c := tls.Client(cli, &tls.Config{RootCAs: ca.Pool(), ServerName: "n1", MinVersion: tls.VersionTLS12})
	if err := c.Handshake(); err != nil {
		t.Fatalf("handshake: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("server handshake: %v", err)
	}
	return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

func TestReloadsChangedFilesAndKeepsLastGood(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "ca")
	first := ca.Node(t, "n1")
	certFile, keyFile := first.Write(t, dir, "n1")
	s, err := New(Files{CertFile: certFile, KeyFile: keyFile}, nil)
	if err != nil {
		t.Fatal(err)
	}
	clock := time.Now()
	s.now = func() time.Time { return clock }
	cfg := s.ServerConfig(tls.NoClientCert)
	if got, want := servedSerial(t, cfg, ca), first.Cert.SerialNumber.String(); got != want {
		t.Fatalf("served serial %s, want %s", got, want)
	}

	second := ca.Node(t, "n1")
	second.Write(t, dir, "n1")
	// Within CheckInterval the old certificate is still served: the files are not even looked at.
	if got := servedSerial(t, cfg, ca); got != first.Cert.SerialNumber.String() {
		t.Fatalf("reloaded before the check interval: serial %s", got)
	}
	clock = clock.Add(CheckInterval)
	if got, want := servedSerial(t, cfg, ca), second.Cert.SerialNumber.String(); got != want {
		t.Fatalf("after rotation served serial %s, want %s", got, want)
	}

	// A broken replacement is refused; the last good pair stays.
	if err := os.WriteFile(certFile, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(CheckInterval)
	if got, want := servedSerial(t, cfg, ca), second.Cert.SerialNumber.String(); got != want {
		t.Fatalf("after a broken rotation served serial %s, want the last good %s", got, want)
	}
}

func TestNewNamesTheBadFile(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "ca")
	certFile, keyFile := ca.Node(t, "n1").Write(t, dir, "n1")
	missing := filepath.Join(dir, "missing.pem")
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]Files{
		"missing cert": {CertFile: missing, KeyFile: keyFile},
		"garbage key":  {CertFile: certFile, KeyFile: garbage},
		"garbage CA":   {CertFile: certFile, KeyFile: keyFile, CAFile: garbage},
		"missing CA":   {CertFile: certFile, KeyFile: keyFile, CAFile: missing},
	} {
		_, err := New(f, nil)
		if err == nil {
			t.Errorf("%s: loaded", name)
			continue
		}
		if !strings.Contains(err.Error(), dir) {
			t.Errorf("%s: error %q names no file", name, err)
		}
	}
}
