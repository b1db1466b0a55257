package servertest

import (
	"crypto/tls"
	"net/url"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc/credentials"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest/testcerts"
)

// CA is a throwaway certificate authority (testcerts) bound to a test, for identity and ACL tests: a
// server certificate for the nodes' client ports and client certificates that name identities.
type CA struct {
	t  testing.TB
	ca *testcerts.CA
}

// NewCA makes a CA valid for a day.
func NewCA(t testing.TB) *CA {
	t.Helper()
	return &CA{t: t, ca: testcerts.NewCA(t, "leased test CA")}
}

// ServerTLS is a client-port configuration for 127.0.0.1 that requires and verifies client certificates
// from this CA.
func (ca *CA) ServerTLS() *tls.Config {
	ca.t.Helper()
	return testcerts.ServerConfig(ca.ca.Node(ca.t, "leased"), ca.ca.Pool())
}

// client is a client certificate naming identity as its CN, or, for an identity that parses as a URI
// with a scheme, as its only URI SAN with an empty CN.
func (ca *CA) client(identity string) *testcerts.Pair {
	ca.t.Helper()
	if u, err := url.Parse(identity); err == nil && u.Scheme != "" {
		return ca.ca.Issue(ca.t, testcerts.Options{URIs: []string{identity}, Client: true})
	}
	return ca.ca.Client(ca.t, identity)
}

// ClientTLS is a client configuration that trusts this CA and presents a certificate naming identity
// (see client).
func (ca *CA) ClientTLS(identity string) *tls.Config {
	ca.t.Helper()
	return testcerts.ClientConfig(ca.client(identity), ca.ca.Pool())
}

// ClientFiles writes the CA certificate and a client certificate and key naming identity into dir, for
// leasectl's --cacert, --cert and --key.
func (ca *CA) ClientFiles(dir, identity string) (caFile, certFile, keyFile string) {
	ca.t.Helper()
	p := ca.client(identity)
	caFile, certFile, keyFile = filepath.Join(dir, "ca.pem"), filepath.Join(dir, identity+".pem"), filepath.Join(dir, identity+"-key.pem")
	for name, data := range map[string][]byte{caFile: ca.ca.PEM, certFile: p.CertPEM, keyFile: p.KeyPEM} {
		if err := os.WriteFile(name, data, 0o600); err != nil {
			ca.t.Fatal(err)
		}
	}
	return caFile, certFile, keyFile
}

// StartWithACL starts a cluster whose client ports require certificates from ca (ClientCertAuth) and
// which is founded with rules (Config.InitialACL). Its peers talk mutual TLS with certificates from a CA
// of their own, so that followers forward client identities to the leader. The cluster's own connections
// (Conn, Leases, and the wait for a settled leader) present a certificate naming admin, which rules must
// give read on "".
func StartWithACL(t testing.TB, size int, ca *CA, admin string, rules []*leasepb.AclRule, mutate func(*server.Config)) *Cluster {
	t.Helper()
	peerCA := testcerts.NewCA(t, "leased test peer CA")
	return start(t, size, credentials.NewTLS(ca.ClientTLS(admin)), func(cfg *server.Config) {
		cfg.ClientTLS, cfg.ClientCertAuth, cfg.InitialACL = ca.ServerTLS(), true, rules
		cfg.PeerTLS = testcerts.MutualConfig(peerCA.Node(t, cfg.Name), peerCA)
		if mutate != nil {
			mutate(cfg)
		}
	})
}
