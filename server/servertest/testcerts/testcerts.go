// Package testcerts makes throwaway certificate authorities and certificates in memory (crypto/x509,
// ECDSA P-256), for tests of TLS on the client, peer and admin ports. Nothing here needs openssl, and
// nothing here is fit for production: keys are written unencrypted and every authority is new per test.
//
// A node certificate (CA.Node) names its member the way leased expects on the peer port (CN and a DNS
// SAN equal to the member name) and is valid for localhost and 127.0.0.1, for both server and client
// authentication, so one pair serves a node's client port, its peer port and its outgoing peer dials.
package testcerts

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority.
type CA struct {
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// PEM is the CA certificate, PEM-encoded (a --trusted-ca-file).
	PEM []byte
}

// Pair is an issued certificate with its key.
type Pair struct {
	Cert    *x509.Certificate
	CertPEM []byte
	KeyPEM  []byte
	TLS     tls.Certificate
}

// Options describe a certificate to issue. Zero validity means one day, starting an hour ago.
type Options struct {
	CommonName string
	DNSNames   []string
	IPs        []net.IP
	URIs       []string
	NotBefore  time.Time
	NotAfter   time.Time
	Server     bool // ExtKeyUsageServerAuth
	Client     bool // ExtKeyUsageClientAuth
}

// NewCA makes a self-signed authority called name.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"leased tests"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("create CA %s: %v", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("parse CA %s: %v", name, err)
	}
	return &CA{Cert: cert, key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// Pool is a certificate pool holding only this authority.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Issue signs a certificate described by o.
func (ca *CA) Issue(t testing.TB, o Options) *Pair {
	t.Helper()
	key := newKey(t)
	if o.NotBefore.IsZero() {
		o.NotBefore = time.Now().Add(-time.Hour)
	}
	if o.NotAfter.IsZero() {
		o.NotAfter = time.Now().Add(24 * time.Hour)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: o.CommonName},
		DNSNames:     o.DNSNames,
		IPAddresses:  o.IPs,
		NotBefore:    o.NotBefore,
		NotAfter:     o.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	for _, u := range o.URIs {
		parsed, err := parseURI(u)
		if err != nil {
			t.Fatalf("URI SAN %q: %v", u, err)
		}
		tmpl.URIs = append(tmpl.URIs, parsed)
	}
	if o.Server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if o.Client {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatalf("issue %s: %v", o.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("parse %s: %v", o.CommonName, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatalf("marshal key: %v", err)
	}
	p := &Pair{
		Cert:    cert,
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}
	if p.TLS, err = tls.X509KeyPair(p.CertPEM, p.KeyPEM); err != nil {
		t.Fatalf("key pair %s: %v", o.CommonName, err)
	}
	return p
}

// Node issues a node certificate for member name: CN and DNS SAN name, plus localhost and 127.0.0.1,
// for server and client authentication.
func (ca *CA) Node(t testing.TB, name string) *Pair {
	t.Helper()
	return ca.Issue(t, Options{CommonName: name, DNSNames: []string{name, "localhost"},
		IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Server: true, Client: true})
}

// Client issues a client certificate whose identity (CN) is name.
func (ca *CA) Client(t testing.TB, name string) *Pair {
	t.Helper()
	return ca.Issue(t, Options{CommonName: name, Client: true})
}

// Expired issues a client certificate for name that expired an hour ago.
func (ca *CA) Expired(t testing.TB, name string) *Pair {
	t.Helper()
	return ca.Issue(t, Options{CommonName: name, Client: true,
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
}

// WriteCA writes the authority's certificate to dir/name and returns the path.
func (ca *CA) WriteCA(t testing.TB, dir, name string) string {
	t.Helper()
	return write(t, filepath.Join(dir, name), ca.PEM)
}

// Write writes the pair to dir/base.crt and dir/base.key and returns both paths.
func (p *Pair) Write(t testing.TB, dir, base string) (certFile, keyFile string) {
	t.Helper()
	return write(t, filepath.Join(dir, base+".crt"), p.CertPEM), write(t, filepath.Join(dir, base+".key"), p.KeyPEM)
}

// ServerConfig is a TLS 1.2+ server configuration serving p; with clients set it also requires and
// verifies client certificates signed by clients.
func ServerConfig(p *Pair, clients *x509.CertPool) *tls.Config {
	c := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{p.TLS}}
	if clients != nil {
		c.ClientCAs, c.ClientAuth = clients, tls.RequireAndVerifyClientCert
	}
	return c
}

// ClientConfig is a TLS 1.2+ client configuration trusting roots, presenting p when p is non-nil.
func ClientConfig(p *Pair, roots *x509.CertPool) *tls.Config {
	c := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots}
	if p != nil {
		c.Certificates = []tls.Certificate{p.TLS}
	}
	return c
}

// MutualConfig is one configuration for both ends of mutual TLS between nodes (a server.Config.PeerTLS):
// it serves and presents p, and trusts ca on both sides.
func MutualConfig(p *Pair, ca *CA) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{p.TLS},
		RootCAs:      ca.Pool(),
		ClientCAs:    ca.Pool(),
		ClientAuth:   tls.RequireAndVerifyClientCert,
	}
}

func write(t testing.TB, path string, data []byte) string {
	t.Helper()
	// Write then rename, so a reader polling the file never sees half of it (rotation tests).
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatalf("write %s: %v", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatalf("rename %s: %v", path, err)
	}
	return path
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("generate key: %v", err)
	}
	return key
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatalf("serial: %v", err)
	}
	return n.Add(n, big.NewInt(1))
}

func parseURI(s string) (*url.URL, error) { return url.Parse(s) }
