package server

import (
	"strings"
	"testing"
)

func TestParseGossipKey(t *testing.T) {
	for _, tc := range []struct {
		text string
		size int    // 0: refused
		msg  string // in the refusal
	}{
		{"MDEyMzQ1Njc4OWFiY2RlZg==\n", 16, ""},
		{"  MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=  ", 32, ""},
		{"MDEyMzQ1Njc4OQ==", 0, "10 bytes"},
		{"not base64!", 0, "not base64"},
	} {
		key, err := ParseGossipKey([]byte(tc.text))
		switch {
		case tc.size > 0 && (err != nil || len(key) != tc.size):
			t.Errorf("%q: %d bytes, %v; want %d", tc.text, len(key), err, tc.size)
		case tc.size == 0 && (err == nil || !strings.Contains(err.Error(), tc.msg)):
			t.Errorf("%q: %v, want a refusal mentioning %q", tc.text, err, tc.msg)
		}
	}
}

func TestConfigRefusesUnreachableAddresses(t *testing.T) {
	base := TestConfig()
	base.Name, base.DataDir = "n1", t.TempDir()
	base.ClientAddr, base.PeerAddr = "127.0.0.1:7101", "127.0.0.1:7201"
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		want   string // "" means valid
	}{
		{"loopback", func(*Config) {}, ""},
		{"client on 0.0.0.0", func(c *Config) { c.ClientAddr = "0.0.0.0:7101" }, "advertise client address"},
		{"client on [::] with advertise", func(c *Config) { c.ClientAddr, c.AdvertiseClientAddr = "[::]:7101", "n1:7101" }, ""},
		{"peer on :7201", func(c *Config) { c.PeerAddr = ":7201" }, "advertise peer address"},
		{"advertise 0.0.0.0", func(c *Config) { c.AdvertisePeerAddr = "0.0.0.0:7201" }, "must be host:port"},
		{"gossip on 0.0.0.0", func(c *Config) { c.GossipAddr = "0.0.0.0:7301" }, "advertise gossip address"},
		{"gossip without a key on an address", func(c *Config) { c.GossipAddr = "10.0.0.1:7301" }, "--insecure-gossip"},
		{"gossip without a key on every interface", func(c *Config) { c.GossipAddr, c.AdvertiseGossipAddr = ":7301", "n1:7301" }, "--insecure-gossip"},
		{"insecure gossip allowed", func(c *Config) { c.GossipAddr, c.InsecureGossip = "10.0.0.1:7301", true }, ""},
		{"gossip with a key on an address", func(c *Config) { c.GossipAddr, c.GossipKey = "10.0.0.1:7301", make([]byte, 16) }, ""},
		{"gossip on loopback", func(c *Config) { c.GossipAddr = "127.0.0.1:7301" }, ""},
		{"join through plain gossip without a token", func(c *Config) {
			c.GossipAddr, c.Join, c.InitialClusterState = "127.0.0.1:7301", []string{"127.0.0.1:7302"}, ClusterStateExisting
		}, "--initial-cluster-token"},
		{"join through plain gossip with a token", func(c *Config) {
			c.GossipAddr, c.Join, c.InitialClusterState = "127.0.0.1:7301", []string{"127.0.0.1:7302"}, ClusterStateExisting
			c.InitialClusterToken = "t"
		}, ""},
		{"join without gossip", func(c *Config) { c.Join = []string{"n2:7301"} }, "needs a gossip address"},
		{"short gossip key", func(c *Config) { c.GossipAddr, c.GossipKey = "127.0.0.1:7301", []byte("short") }, "16, 24 or 32"},
		{"bad cluster state", func(c *Config) { c.InitialClusterState = "maybe" }, "initial cluster state"},
	} {
		cfg := base
		tc.mutate(&cfg)
		err := cfg.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want an error mentioning %q", tc.name, err, tc.want)
		}
	}
}
