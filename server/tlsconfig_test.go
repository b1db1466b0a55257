package server

import (
	"crypto/tls"
	"strings"
	"testing"
)

// Client certificate auth needs a client TLS configuration that requires and verifies them, and a
// plaintext peer port must stay on loopback unless InsecurePeer says the network is trusted.
func TestValidateTLS(t *testing.T) {
	base := func() Config {
		c := TestConfig()
		c.Name, c.DataDir, c.ClientAddr, c.PeerAddr = "n1", "/d", "127.0.0.1:1", "127.0.0.1:2"
		return c
	}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string // "" valid
	}{
		{"plaintext on loopback", func(*Config) {}, ""},
		{"client cert auth without TLS", func(c *Config) { c.ClientCertAuth = true }, "client certificate auth needs"},
		{"client cert auth, TLS not verifying", func(c *Config) { c.ClientCertAuth, c.ClientTLS = true, &tls.Config{} }, "client certificate auth needs"},
		{"client cert auth verifying", func(c *Config) {
			c.ClientCertAuth, c.ClientTLS = true, &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert}
		}, ""},
		{"plaintext peers on all interfaces", func(c *Config) { c.PeerAddr = ":7201" }, "peer address :7201 is not loopback"},
		{"plaintext peers on an address", func(c *Config) { c.PeerAddr = "10.0.0.1:7201" }, "--insecure-peer"},
		{"insecure peers allowed", func(c *Config) { c.PeerAddr, c.InsecurePeer = "10.0.0.1:7201", true }, ""},
		{"peer TLS on an address", func(c *Config) { c.PeerAddr, c.PeerTLS = "10.0.0.1:7201", &tls.Config{} }, ""},
		{"localhost", func(c *Config) { c.PeerAddr = "localhost:7201" }, ""},
		{"ipv6 loopback", func(c *Config) { c.PeerAddr = "[::1]:7201" }, ""},
	} {
		c := base()
		tc.edit(&c)
		err := c.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
