package server

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/wirepb"
)

// Gossip (hashicorp/memberlist on Config.GossipAddr) discovers nodes and their metadata — name, raft and
// cluster id, advertised client, peer and gossip addresses, version, and whether they know a leader — so
// that a new member can find the cluster from any node's gossip address (--join). What gossip says is a
// hint: a joining node checks the cluster it reaches against --initial-cluster-token (discover.go), and
// clients are sent only to addresses in the member table. Gossip never adds or removes a voter, and never
// changes the member table: raft does (decision 7). Without --gossip-key-file it is unencrypted and
// unauthenticated, so it stays on loopback unless --insecure-gossip says the network is trusted.

// gossip is a node's memberlist and the metadata it gossips about itself.
type gossip struct {
	ml  *memberlist.Memberlist
	log *slog.Logger

	mu   sync.Mutex
	meta []byte // NodeMeta's answer, encoded
}

// startGossip binds the gossip address and, if join is not empty, joins those members. It returns with
// the join done (or failed: the caller decides whether that matters).
func startGossip(cfg Config, logger *slog.Logger, meta *wirepb.GossipMeta) (*gossip, error) {
	mc := memberlist.DefaultLANConfig()
	mc.Name = cfg.Name
	host, port, err := splitHostPort(cfg.GossipAddr)
	if err != nil {
		return nil, fmt.Errorf("gossip address: %w", err)
	}
	mc.BindAddr, mc.BindPort = host, port
	if host == "" {
		mc.BindAddr = "0.0.0.0"
	}
	adv := advertised(cfg.AdvertiseGossipAddr, cfg.GossipAddr)
	ahost, aport, err := splitHostPort(adv)
	if err != nil {
		return nil, fmt.Errorf("advertise gossip address: %w", err)
	}
	if mc.AdvertiseAddr, err = resolveIP(ahost); err != nil {
		return nil, fmt.Errorf("advertise gossip address %s: %w", adv, err)
	}
	mc.AdvertisePort = aport
	if len(cfg.GossipKey) > 0 {
		mc.SecretKey = cfg.GossipKey
	}
	g := &gossip{log: logger.With("component", "gossip")}
	g.setMeta(meta)
	mc.Delegate = g
	mc.Logger = log.New(memberlistLog{g.log}, "", 0)
	if g.ml, err = memberlist.Create(mc); err != nil {
		return nil, fmt.Errorf("start gossip on %s: %w", cfg.GossipAddr, err)
	}
	return g, nil
}

// splitHostPort splits host:port with a numeric port.
func splitHostPort(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("%q: port must be 0..65535", addr)
	}
	return host, port, nil
}

// resolveIP is host as an IP address (memberlist advertises IPs), looked up once if it is a name.
func resolveIP(host string) (string, error) {
	if ip := net.ParseIP(host); ip != nil {
		return host, nil
	}
	ips, err := net.LookupIP(host)
	if err != nil || len(ips) == 0 {
		return "", fmt.Errorf("resolve %q: %v", host, err)
	}
	for _, ip := range ips {
		if ip.To4() != nil {
			return ip.String(), nil
		}
	}
	return ips[0].String(), nil
}

// join joins the members at addrs (gossip host:port). It succeeds when one of them answered.
func (g *gossip) join(addrs []string) error {
	n, err := g.ml.Join(addrs)
	if n > 0 {
		return nil
	}
	if err == nil {
		err = errors.New("no member answered")
	}
	return fmt.Errorf("gossip join %s: %w", strings.Join(addrs, ","), err)
}

// setMeta replaces the metadata this node gossips; update spreads it.
func (g *gossip) setMeta(m *wirepb.GossipMeta) bool {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if bytes.Equal(b, g.meta) {
		return false
	}
	g.meta = b
	return true
}

// update gossips this node's current metadata now.
func (g *gossip) update() {
	if err := g.ml.UpdateNode(time.Second); err != nil {
		g.log.Debug("gossip metadata update", "err", err)
	}
}

// others are the live members' metadata, but this node's, sorted by name.
func (g *gossip) others() []*wirepb.GossipMeta {
	var out []*wirepb.GossipMeta
	local := g.ml.LocalNode().Name
	for _, n := range g.ml.Members() {
		if n.Name == local || n.State != memberlist.StateAlive {
			continue
		}
		m := new(wirepb.GossipMeta)
		if proto.Unmarshal(n.Meta, m) == nil {
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b *wirepb.GossipMeta) int { return strings.Compare(a.GetName(), b.GetName()) })
	return out
}

// peerAddrs are the peer addresses of the live members gossip knows in cluster (any cluster if 0).
func (g *gossip) peerAddrs(cluster uint64) []string {
	var out []string
	for _, m := range g.others() {
		if m.GetPeerAddr() != "" && m.GetClusterId() != 0 && (cluster == 0 || m.GetClusterId() == cluster) {
			out = append(out, m.GetPeerAddr())
		}
	}
	return out
}

// close leaves the gossip pool (so the others forget this node at once) and stops memberlist.
func (g *gossip) close() error {
	lerr := g.ml.Leave(time.Second)
	return errors.Join(lerr, g.ml.Shutdown())
}

// NodeMeta implements memberlist.Delegate: this node's metadata.
func (g *gossip) NodeMeta(limit int) []byte {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.meta) > limit {
		return nil
	}
	return slices.Clone(g.meta)
}

// NotifyMsg, GetBroadcasts, LocalState and MergeRemoteState implement memberlist.Delegate: leased sends
// nothing over gossip but node metadata.
func (g *gossip) NotifyMsg([]byte)                           {}
func (g *gossip) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (g *gossip) LocalState(join bool) []byte                { return nil }
func (g *gossip) MergeRemoteState(buf []byte, join bool)     {}

// memberlistLog turns memberlist's "[LEVEL] memberlist: ..." lines into slog records.
type memberlistLog struct{ log *slog.Logger }

func (w memberlistLog) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	switch {
	case strings.HasPrefix(line, "[ERR]"):
		w.log.Error(strings.TrimSpace(strings.TrimPrefix(line, "[ERR]")))
	case strings.HasPrefix(line, "[WARN]"):
		w.log.Warn(strings.TrimSpace(strings.TrimPrefix(line, "[WARN]")))
	default:
		w.log.Debug(line)
	}
	return len(p), nil
}

var _ io.Writer = memberlistLog{}

// ParseGossipKey reads a --gossip-key-file's content: the base64 encoding of a 16, 24 or 32 byte key
// (AES-128, -192 or -256), as `head -c 32 /dev/urandom | base64` writes it.
func ParseGossipKey(text []byte) ([]byte, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(text)))
	if err != nil {
		return nil, fmt.Errorf("gossip key is not base64: %w", err)
	}
	switch len(key) {
	case 16, 24, 32:
		return key, nil
	}
	return nil, fmt.Errorf("gossip key is %d bytes; it must be 16, 24 or 32 (base64 of `head -c 32 /dev/urandom`)", len(key))
}
