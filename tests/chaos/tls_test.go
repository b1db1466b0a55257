package chaos

import (
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/leased/leased/server/servertest/testcerts"
)

// chaosTLS is a run with TLS on (LEASED_CHAOS_TLS=1, make chaos TLS=1): every node serves TLS on its
// client and peer ports from certificate files, requires client certificates, and talks mutual TLS to
// its peers; the workload, the legacy holders and the harness's own Status calls present a client
// certificate. The fault proxies between peers (HTTP CONNECT tunnels) and the client-side fault layer
// (a dialer) only move bytes, so the TLS sessions pass through them end to end.
type chaosTLS struct {
	nodeArgs func(i int) []string
	client   *tls.Config
}

func tlsFromEnv() bool { return os.Getenv("LEASED_CHAOS_TLS") == "1" }

// newChaosTLS writes a CA and the certificates of size nodes (n1, ...) and of the harness into dir.
func newChaosTLS(t testing.TB, dir string, size int) *chaosTLS {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ca := testcerts.NewCA(t, "chaos-ca")
	caFile := ca.WriteCA(t, dir, "ca.crt")
	certs := make([][2]string, size)
	for i := range size {
		name := fmt.Sprintf("n%d", i+1)
		cert, key := ca.Node(t, name).Write(t, dir, name)
		certs[i] = [2]string{cert, key}
	}
	// Every workload client is the identity "chaos"; with client certificates required and no rules,
	// everything would be refused.
	aclFile := filepath.Join(dir, "acl.yaml")
	acl := "rules:\n  - identity: chaos\n    prefix: \"\"\n    permissions: [read, lease, admin]\n"
	if err := os.WriteFile(aclFile, []byte(acl), 0o644); err != nil {
		t.Fatal(err)
	}
	return &chaosTLS{
		nodeArgs: func(i int) []string {
			cert, key := certs[i][0], certs[i][1]
			return []string{"--cert-file=" + cert, "--key-file=" + key, "--trusted-ca-file=" + caFile, "--client-cert-auth",
				"--peer-cert-file=" + cert, "--peer-key-file=" + key, "--peer-trusted-ca-file=" + caFile,
				"--initial-acl-file=" + aclFile}
		},
		client: testcerts.ClientConfig(ca.Client(t, "chaos"), ca.Pool()),
	}
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
