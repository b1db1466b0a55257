package client_test

import (
	"context"
	"crypto/tls"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/leased/leased/client"
	"github.com/leased/leased/server/servertest"
	"github.com/leased/leased/server/servertest/testcerts"
)

// Against a cluster that requires client certificates, the SDK works with the right credentials, and
// each TLS failure ends the call quickly with ErrUnauthenticated naming the problem, not with a
// "context deadline exceeded" at the end of the call's timeout.
func TestTLSFailuresAreUnauthenticated(t *testing.T) {
	ca := testcerts.NewCA(t, "ca")
	cl := servertest.StartTLS(t, 3, ca, nil)
	good := newClient(t, cl.Endpoints(), func(c *client.Config) { c.TLS = testcerts.ClientConfig(ca.Client(t, "alice"), ca.Pool()) })
	l, err := good.Acquire(ctxT(t), "tls/sdk", client.WithTTL(time.Minute))
	if err != nil {
		t.Fatalf("acquire over mutual TLS: %v", err)
	}
	defer l.Release(context.Background())

	other := testcerts.NewCA(t, "other")
	for name, tc := range map[string]struct {
		cfg  *tls.Config
		hint string
	}{
		"unknown CA":          {testcerts.ClientConfig(ca.Client(t, "alice"), other.Pool()), "not signed by a trusted CA"},
		"no certificate":      {testcerts.ClientConfig(nil, ca.Pool()), "requires a client certificate"},
		"expired certificate": {testcerts.ClientConfig(ca.Expired(t, "alice"), ca.Pool()), "expired"},
	} {
		t.Run(name, func(t *testing.T) {
			c := newClient(t, cl.Endpoints(), func(c *client.Config) { c.TLS, c.RequestTimeout = tc.cfg, 10*time.Second })
			start := time.Now()
			_, err := c.Get(context.Background(), "tls/sdk")
			if !errors.Is(err, client.ErrUnauthenticated) || !strings.Contains(err.Error(), tc.hint) {
				t.Fatalf("get: %v; want ErrUnauthenticated naming %q", err, tc.hint)
			}
			if strings.Contains(err.Error(), "deadline exceeded") || time.Since(start) > 8*time.Second {
				t.Fatalf("the TLS failure surfaced as a timeout after %v: %v", time.Since(start), err)
			}
		})
	}
}
