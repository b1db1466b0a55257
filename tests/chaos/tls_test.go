package chaos

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/leased/leased/server/servertest/testcerts"
)

// chaosTLS is a run with TLS on (LEASED_CHAOS_TLS=1, make chaos TLS=1): every node serves TLS on its
// client and peer ports from certificate files, requires client certificates, and talks mutual TLS to
// its peers with certificates from a CA of their own (serverAuth and clientAuth, as the peer port requires); the workload, the legacy holders and the harness's own Status calls present a client
// certificate. The fault proxies between peers (HTTP CONNECT tunnels) and the client-side fault layer
// (a dialer) only move bytes, so the TLS sessions pass through them end to end.
type chaosTLS struct {
	t           testing.TB
	ca, peerCA  *testcerts.CA
	dir         string
	caFile, acl string
	peerCAFile  string
	client      *tls.Config
	mu          sync.Mutex
	certs       map[string][4]string // node name -> certificate and key files, client port then peer port
}

func tlsFromEnv() bool { return os.Getenv("LEASED_CHAOS_TLS") == "1" }

// newChaosTLS writes a CA, the harness's certificate and the ACL into dir; nodeArgs writes each node's
// certificate, for the name it runs under, when it first starts.
func newChaosTLS(t testing.TB, dir string) *chaosTLS {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ca := testcerts.NewCA(t, "chaos-ca")
	// Every workload client is the identity "chaos"; with client certificates required and no rules,
	// everything would be refused.
	aclFile := filepath.Join(dir, "acl.yaml")
	acl := "rules:\n  - identity: chaos\n    prefix: \"\"\n    permissions: [read, lease, admin]\n"
	if err := os.WriteFile(aclFile, []byte(acl), 0o644); err != nil {
		t.Fatal(err)
	}
	peerCA := testcerts.NewCA(t, "chaos-peer-ca")
	return &chaosTLS{
		t: t, ca: ca, dir: dir, caFile: ca.WriteCA(t, dir, "ca.crt"), acl: aclFile,
		peerCA: peerCA, peerCAFile: peerCA.WriteCA(t, dir, "peer-ca.crt"),
		client: testcerts.ClientConfig(ca.Client(t, "chaos"), ca.Pool()),
		certs:  map[string][4]string{},
	}
}

// nodeArgs are the TLS flags of a node running as name. Its certificate names it: the peers refuse a
// member whose certificate names another (a replaced node runs under a new name, so it gets a new one).
func (c *chaosTLS) nodeArgs(name string) []string {
	c.mu.Lock()
	files, ok := c.certs[name]
	if !ok {
		cert, key := c.ca.Node(c.t, name).Write(c.t, c.dir, name)
		peerCert, peerKey := c.peerCA.Node(c.t, name).Write(c.t, c.dir, name+"-peer")
		files = [4]string{cert, key, peerCert, peerKey}
		c.certs[name] = files
	}
	c.mu.Unlock()
	return []string{"--cert-file=" + files[0], "--key-file=" + files[1], "--trusted-ca-file=" + c.caFile, "--client-cert-auth",
		"--peer-cert-file=" + files[2], "--peer-key-file=" + files[3], "--peer-trusted-ca-file=" + c.peerCAFile,
		"--initial-acl-file=" + c.acl}
}

// clientTLS is the SDK's TLS configuration: nil without TLS.
func (c *chaosTLS) clientTLS() *tls.Config {
	if c == nil {
		return nil
	}
	return c.client
}

// creds are the transport credentials of a raw gRPC connection to a node.
func (c *chaosTLS) creds() credentials.TransportCredentials {
	if c == nil {
		return insecure.NewCredentials()
	}
	return credentials.NewTLS(c.client)
}

func certsDir(dir string) string { return filepath.Join(dir, "certs") }
