package servertest

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

	"google.golang.org/grpc/credentials"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server"
)

// CA is a throwaway certificate authority for tests: it signs a server certificate for 127.0.0.1 and
// client certificates that name identities. Keys are ECDSA P-256, made fresh for every CA.
type CA struct {
	t    testing.TB
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
	pem  []byte
}

// NewCA makes a CA valid for a day.
func NewCA(t testing.TB) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial(t), Subject: pkix.Name{CommonName: "leased test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &CA{t: t, cert: cert, key: key, pool: pool, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func serial(t testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// issue signs a leaf certificate from tmpl and returns it with its key, in PEM.
func (ca *CA) issue(tmpl *x509.Certificate) (certPEM, keyPEM []byte) {
	ca.t.Helper()
	key := newKey(ca.t)
	tmpl.SerialNumber = serial(ca.t)
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		ca.t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		ca.t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
}

func (ca *CA) keyPair(certPEM, keyPEM []byte) tls.Certificate {
	ca.t.Helper()
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		ca.t.Fatal(err)
	}
	return pair
}

// ServerTLS is a client-port configuration for 127.0.0.1 that requires and verifies client certificates
// from this CA.
func (ca *CA) ServerTLS() *tls.Config {
	ca.t.Helper()
	certPEM, keyPEM := ca.issue(&x509.Certificate{
		Subject: pkix.Name{CommonName: "leased"}, DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	return &tls.Config{
		MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{ca.keyPair(certPEM, keyPEM)},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.pool,
	}
}

// clientPEM is a client certificate naming identity as its CN, or, for an identity that parses as a URI
// with a scheme, as its only URI SAN with an empty CN.
func (ca *CA) clientPEM(identity string) (certPEM, keyPEM []byte) {
	tmpl := &x509.Certificate{ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if u, err := url.Parse(identity); err == nil && u.Scheme != "" {
		tmpl.URIs = []*url.URL{u}
	} else {
		tmpl.Subject = pkix.Name{CommonName: identity}
	}
	return ca.issue(tmpl)
}

// ClientTLS is a client configuration that trusts this CA and presents a certificate naming identity
// (see clientPEM).
func (ca *CA) ClientTLS(identity string) *tls.Config {
	ca.t.Helper()
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: ca.pool, Certificates: []tls.Certificate{ca.keyPair(ca.clientPEM(identity))}}
}

// ClientFiles writes the CA certificate and a client certificate and key naming identity into dir, for
// leasectl's --cacert, --cert and --key.
func (ca *CA) ClientFiles(dir, identity string) (caFile, certFile, keyFile string) {
	ca.t.Helper()
	certPEM, keyPEM := ca.clientPEM(identity)
	caFile, certFile, keyFile = filepath.Join(dir, "ca.pem"), filepath.Join(dir, identity+".pem"), filepath.Join(dir, identity+"-key.pem")
	for name, data := range map[string][]byte{caFile: ca.pem, certFile: certPEM, keyFile: keyPEM} {
		if err := os.WriteFile(name, data, 0o600); err != nil {
			ca.t.Fatal(err)
		}
	}
	return caFile, certFile, keyFile
}

// StartWithACL starts a cluster whose client ports require certificates from ca (ClientCertAuth) and
// which is founded with rules (Config.InitialACL). The cluster's own connections (Conn, Leases, and the
// wait for a settled leader) present a certificate naming admin, which rules must give read on "".
func StartWithACL(t testing.TB, size int, ca *CA, admin string, rules []*leasepb.AclRule, mutate func(*server.Config)) *Cluster {
	t.Helper()
	return start(t, size, credentials.NewTLS(ca.ClientTLS(admin)), func(cfg *server.Config) {
		cfg.ClientTLS, cfg.ClientCertAuth, cfg.InitialACL = ca.ServerTLS(), true, rules
		if mutate != nil {
			mutate(cfg)
		}
	})
}
