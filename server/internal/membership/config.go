package membership

import (
	"net"
	"time"

	"github.com/leased/leased/api/wirepb"
	"github.com/leased/leased/server/internal/errs"
)

// Config is what membership needs of the node's configuration (package server fills it from its Config).
type Config struct {
	// Name is this member's name; ClientAddr and PeerAddr its advertised addresses.
	Name, ClientAddr, PeerAddr string
	// InitialCluster maps the founding members' names to their peer addresses.
	InitialCluster map[string]string
	// PeerTLS says the peer port authenticates callers by certificate, so a Join's caller is known.
	PeerTLS                                        bool
	TickInterval, ElectionTimeout, ProposalTimeout time.Duration
	// MarkRemoved persists that this node was removed (nil: nowhere to persist it, as in simulations).
	MarkRemoved func(why string) error

	// GossipAddr is the address gossip listens on ("": no gossip); GossipAdvertise the one it tells
	// others; GossipKey encrypts it (nil: plaintext). Join lists gossip addresses to join.
	GossipAddr, GossipAdvertise string
	GossipKey                   []byte
	Join                        []string
	// Version is the server version a node gossips.
	Version string
}

// promoteAfter is how long a learner must stay caught up (within promoteLag of the leader's last index)
// before the leader promotes it: long enough that a learner that only touched the leader's index once,
// mid-snapshot or mid-burst, is not made a voter that would then slow every commit.
func (c Config) promoteAfter() time.Duration { return 5 * c.ElectionTimeout }

// localMeta is what a node gossips before it knows its ids.
func (c Config) localMeta() *wirepb.GossipMeta {
	return &wirepb.GossipMeta{Name: c.Name, ClientAddr: c.ClientAddr, PeerAddr: c.PeerAddr,
		GossipAddr: Advertised(c.GossipAdvertise, c.GossipAddr), Version: c.Version}
}

// ValidAdvertise reports whether addr is a host:port others can dial: a host that is not 0.0.0.0 or
// [::], and a port that is not 0.
func ValidAdvertise(addr string) bool {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" || port == "" || port == "0" {
		return false
	}
	ip := net.ParseIP(host)
	return ip == nil || !ip.IsUnspecified()
}

// Advertised returns the advertise address, or the listen address when none is given.
func Advertised(advertise, listen string) string {
	if advertise != "" {
		return advertise
	}
	return listen
}

// validName checks a member name: 1 to max bytes of [A-Za-z0-9_.-].
func validName(field, name string, maxBytes int) error {
	switch {
	case name == "":
		return errs.Invalid(field, "must not be empty")
	case len(name) > maxBytes:
		return errs.Invalid(field, "is %d bytes, the limit is %d", len(name), maxBytes)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			return errs.Invalid(field, "%q has a character outside [A-Za-z0-9_.-] at byte %d", name, i)
		}
	}
	return nil
}
