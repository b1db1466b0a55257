package main

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/leased/leased/server/servertest"
	"github.com/leased/leased/server/servertest/testcerts"
)

// A three-node cluster with TLS on the client and peer ports and client certificates required: leasectl
// acquires and renews with --cacert, --cert and --key (or their variables), and every TLS failure exits
// 6 with a message that names the problem, at once rather than at the timeout.
func TestTLSCluster(t *testing.T) {
	ca := testcerts.NewCA(t, "leased-ca")
	c := servertest.StartTLS(t, 3, ca, nil)
	eps := c.Endpoints()
	dir := t.TempDir()
	caFile := ca.WriteCA(t, dir, "ca.crt")
	aliceCert, aliceKey := ca.Client(t, "alice").Write(t, dir, "alice")
	expCert, expKey := ca.Expired(t, "old").Write(t, dir, "expired")
	other := testcerts.NewCA(t, "other-ca")
	otherCA := other.WriteCA(t, dir, "other-ca.crt")
	strangerCert, strangerKey := other.Client(t, "mallory").Write(t, dir, "stranger")
	creds := []string{"--cacert", caFile, "--cert", aliceCert, "--key", aliceKey}

	acq := want(t, ctl(t, eps, append(creds, "-o", "json", "acquire", "tls/a", "--ttl", "30s", "--holder", "alice")...), 0)
	lease := mustJSON[leaseJSON](t, acq.stdout)
	want(t, ctl(t, eps, append(creds, "renew", "tls/a", "--token", strconv.FormatUint(lease.Token, 10))...), 0)

	t.Run("FromEnvironment", func(t *testing.T) {
		t.Setenv("LEASECTL_CACERT", caFile)
		t.Setenv("LEASECTL_CERT", aliceCert)
		t.Setenv("LEASECTL_KEY", aliceKey)
		got := mustJSON[infoJSON](t, want(t, ctl(t, eps, "-o", "json", "get", "tls/a"), 0).stdout)
		if got.Token != lease.Token {
			t.Fatalf("get: %+v, want token %d", got, lease.Token)
		}
	})

	for _, tc := range []struct {
		name string
		args []string
		msg  string
	}{
		{"WrongCA", []string{"--cacert", otherCA, "--cert", aliceCert, "--key", aliceKey}, "not signed by a trusted CA"},
		{"NoClientCertificate", []string{"--cacert", caFile}, "client certificate"},
		{"ExpiredCertificate", []string{"--cacert", caFile, "--cert", expCert, "--key", expKey}, "client certificate"},
		{"CertificateFromAnotherCA", []string{"--cacert", caFile, "--cert", strangerCert, "--key", strangerKey}, "client certificate"},
		{"PlaintextToTLSPort", []string{}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := ctl(t, eps, append(tc.args, "--timeout", "10s", "get", "tls/a")...)
			if tc.msg == "" { // plaintext: the server cannot say TLS is wanted; the call just fails
				if r.code == 0 {
					t.Fatalf("plaintext call succeeded: %v", r)
				}
				return
			}
			want(t, r, exitAuth)
			if !strings.Contains(r.stderr, "TLS handshake") || !strings.Contains(r.stderr, tc.msg) {
				t.Fatalf("stderr %q does not name the TLS problem (%q)", r.stderr, tc.msg)
			}
			if strings.Contains(r.stderr, "deadline exceeded") || r.elapsed > 8e9 {
				t.Fatalf("the TLS failure surfaced as a timeout: %v", r)
			}
		})
	}
	_ = os.Remove(caFile) // a missing --cacert is a usage error, before the network
	want(t, ctl(t, eps, append(creds, "get", "tls/a")...), exitUsage)
}
