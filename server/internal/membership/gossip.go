package membership

import (
	"bytes"
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
// hint: a joining node checks the cluster it reaches against --initial-cluster-token (server/discover.go), and
// clients are sent only to addresses in the member table. Gossip never adds or removes a voter, and never
// changes the member table: raft does (decision 7). Without --gossip-key-file it is unencrypted and
// unauthenticated, so it stays on loopback unless --insecure-gossip says the network is trusted.

// Gossip is a node's memberlist and the metadata it gossips about itself.
type Gossip struct {
	ml  *memberlist.Memberlist
	log *slog.Logger

	mu   sync.Mutex
	meta []byte // NodeMeta's answer, encoded
}

// StartGossip binds cfg.GossipAddr and gossips cfg's metadata (localMeta) until the node knows its ids.
func StartGossip(cfg Config, logger *slog.Logger) (*Gossip, error) {
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
	adv := Advertised(cfg.GossipAdvertise, cfg.GossipAddr)
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
	g := &Gossip{log: logger.With("component", "gossip")}
	g.setMeta(cfg.localMeta())
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

// Join joins the members at addrs (gossip host:port). It succeeds when one of them answered.
func (g *Gossip) Join(addrs []string) error {
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
func (g *Gossip) setMeta(m *wirepb.GossipMeta) bool {
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

// Alone reports whether gossip knows no other node.
func (g *Gossip) Alone() bool { return g.ml.NumMembers() < 2 }

// update gossips this node's current metadata now.
func (g *Gossip) update() {
	if err := g.ml.UpdateNode(time.Second); err != nil {
		g.log.Debug("gossip metadata update", "err", err)
	}
}

// others are the live members' metadata, but this node's, sorted by name.
func (g *Gossip) others() []*wirepb.GossipMeta {
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

// PeerAddrs are the peer addresses of the live members gossip knows in cluster (any cluster if 0).
func (g *Gossip) PeerAddrs(cluster uint64) []string {
	var out []string
	for _, m := range g.others() {
		if m.GetPeerAddr() != "" && m.GetClusterId() != 0 && (cluster == 0 || m.GetClusterId() == cluster) {
			out = append(out, m.GetPeerAddr())
		}
	}
	return out
}

// Close leaves the gossip pool (so the others forget this node at once) and stops memberlist.
func (g *Gossip) Close() error {
	lerr := g.ml.Leave(time.Second)
	return errors.Join(lerr, g.ml.Shutdown())
}

// NodeMeta implements memberlist.Delegate: this node's metadata.
func (g *Gossip) NodeMeta(limit int) []byte {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.meta) > limit {
		return nil
	}
	return slices.Clone(g.meta)
}

// NotifyMsg, GetBroadcasts, LocalState and MergeRemoteState implement memberlist.Delegate: leased sends
// nothing over gossip but node metadata.
func (g *Gossip) NotifyMsg([]byte)                           {}
func (g *Gossip) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (g *Gossip) LocalState(join bool) []byte                { return nil }
func (g *Gossip) MergeRemoteState(buf []byte, join bool)     {}

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
